"""A relay whose stream breaks: it ends, with one line naming the host, and frees the lock.

Over two real loopback sshd hosts, a relay's source session is killed, its file truncated
while it is read, or its destination's session killed, each at a chosen byte of the
stream (a `Progress` hook fires it, so it lands mid-transfer every time). Every case must
end (a pytest-side limit tells a hang, it is not a timed assertion), report a failure
naming the host, publish nothing, and leave the destination's lock free: the next relay
runs and completes the checkpoint byte-exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from orchestrator.inventory import load_inventory
from orchestrator.relay.run import Progress, RelayOptions, relay
from tests.helpers.checkpoints import make_checkpoint, tree
from tests.helpers.cli import one_error_line

MiB = 1 << 20
HANG = 240  # seconds: far beyond any of these relays; reaching it means a hang


class At(Progress):
    """Runs `action` once, when `after` payload bytes have gone through the relay."""

    def __init__(self, after: int, action: Callable[[], object]):
        self.after, self.action, self.seen, self.fired = after, action, 0, False
        self.lock = threading.Lock()

    def advance(self, nbytes: int) -> None:
        with self.lock:
            self.seen += nbytes
            fire = self.seen >= self.after and not self.fired
            self.fired = self.fired or fire
        if fire:
            self.action()


def ended(call: Callable[[], object], *, cleanup: Callable[[], object]) -> object:
    """`call()`'s result, or a failed test when it has not returned after `HANG` seconds
    (then `cleanup` ends what it waits on, so the session's other tests can run)."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG)
    if t.is_alive():
        cleanup()
        t.join(30)
        raise AssertionError(f"the relay hung: still waiting after {HANG} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _relay(tenv, progress: Progress | None = None):
    inv = load_inventory(tenv.inventory_path)
    return relay(inv, "trainer", ["evalhost"], RelayOptions(jobs=1), progress)


def _fails_then_resumes(tenv, files: dict[str, bytes], action, host: str) -> str:
    """Relay with `action` fired mid-stream: the failure line (naming `host`); then the
    lock is free (the holder ended: its note of who holds the lock is gone, unless it was
    killed with its session) and the next relay completes the checkpoint."""
    hook = At(8 * MiB, action)

    def unhang() -> None:
        tenv.trainer.kill_sessions()
        tenv.evalh.kill_sessions()

    report = ended(lambda: _relay(tenv, hook), cleanup=unhang)
    assert hook.fired and not report.ok
    [(name, dest, line)] = report.failures
    assert name == "step_5" and dest == "evalhost"
    assert host in line and "\n" not in line, line
    assert not (tenv.dst / "step_5").exists()  # nothing half-published
    killed = host == "evalhost"
    assert killed or not (tenv.dst / ".dflash-relay.lock").exists()  # the holder ended
    again = ended(lambda: _relay(tenv), cleanup=unhang)  # the lock is free
    assert again.ok, again.failures
    assert tree(tenv.dst / "step_5") == {p: (tenv.ckpt / "step_5" / p).read_bytes() for p in files}
    tenv.outside_intact()
    return line


def _checkpoint(tenv) -> dict[str, bytes]:
    return make_checkpoint(tenv.ckpt, "step_5", {"big.bin": 64 * MiB, "small.bin": MiB})


def test_a_killed_source_session_ends_the_relay_and_frees_the_lock(tenv):
    files = _checkpoint(tenv)
    line = _fails_then_resumes(tenv, files, tenv.trainer.kill_sessions, "trainer")
    assert "lost" in line


def test_a_source_file_truncated_while_read_ends_the_relay_and_frees_the_lock(tenv):
    files = _checkpoint(tenv)
    big = tenv.ckpt / "step_5" / "big.bin"
    line = _fails_then_resumes(tenv, files, lambda: os.truncate(big, 0), "trainer")
    assert "shrank" in line and "big.bin" in line


def test_a_killed_destination_session_ends_the_relay_and_frees_the_lock(tenv):
    files = _checkpoint(tenv)
    line = _fails_then_resumes(tenv, files, tenv.evalh.kill_sessions, "evalhost")
    assert "lost" in line


KILLER = """#!{real}
\"\"\"The trainer's python: relay-send's stream is cut after {after} bytes by killing
this session's sshd (the connection drops mid-transfer).\"\"\"
import os, signal, subprocess, sys
args = sys.argv[1:]
if "relay-send" not in args:
    os.execv({real!r}, [{real!r}, *args])
proc = subprocess.Popen([{real!r}, *args], stdout=subprocess.PIPE)
sent = 0
for block in iter(lambda: proc.stdout.read1(1 << 20), b""):
    view = memoryview(block)
    while view:
        view = view[os.write(1, view):]
    sent += len(block)
    if sent >= {after}:
        pid = os.getppid()
        while pid > 1:
            with open(f"/proc/{{pid}}/comm") as fh:
                if fh.read().startswith("sshd"):
                    os.kill(pid, signal.SIGKILL)
                    break
            with open(f"/proc/{{pid}}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
sys.exit(proc.wait())
"""


def test_the_cli_ends_with_one_line_naming_the_source_when_its_session_dies(tenv):
    files = _checkpoint(tenv)
    script = tenv.tmp / "python-killer"
    script.write_text(KILLER.format(real=sys.executable, after=8 * MiB))
    script.chmod(0o755)
    tenv.trainer_py = str(script)
    try:
        proc = tenv.cli("step_5", timeout=HANG)
    except subprocess.TimeoutExpired:
        tenv.trainer.kill_sessions()
        tenv.evalh.kill_sessions()
        raise AssertionError(f"the relay hung: still waiting after {HANG} s") from None
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "trainer" in line and "step_5" in line, line
    assert json.loads(proc.stdout)["ok"] is False
    assert not (tenv.dst / "step_5").exists()
    tenv.trainer_py = None
    again = tenv.cli("step_5", timeout=HANG)
    assert again.returncode == 0, again.stderr
    assert tree(tenv.dst / "step_5") == files


# ---- a host that stops: no bytes move -----------------------------------------------------

SILENT_SOURCE = """#!{real}
\"\"\"The trainer's python: relay-send's stream stops after {after} bytes, every pipe left
open (a host that hangs), until the relay closes this session.\"\"\"
import os, select, subprocess, sys
args = sys.argv[1:]
if "relay-send" not in args:
    os.execv({real!r}, [{real!r}, *args])
proc = subprocess.Popen([{real!r}, *args], stdout=subprocess.PIPE)
sent = 0
for block in iter(lambda: proc.stdout.read1(1 << 20), b""):
    view = memoryview(block)
    while view:
        view = view[os.write(1, view):]
    sent += len(block)
    if sent >= {after}:
        break
watch = select.poll()
watch.register(1, 0)  # POLLERR: nobody reads this session's output any more
while not watch.poll(200):
    pass
proc.kill()
"""


def _python(tenv, template: str, after: int) -> str:
    script = tenv.tmp / f"python-{abs(hash(template))}"
    script.write_text(template.format(real=sys.executable, after=after))
    script.chmod(0o755)
    return str(script)


def _lock_freed(tenv) -> None:
    """Wait (a hang is caught by `ended`) until the destination's holder has ended."""
    while (tenv.dst / ".dflash-relay.lock").exists():
        time.sleep(0.1)


def _stalls_then_resumes(tenv, files: dict[str, bytes], side: str) -> str:
    inv = lambda: load_inventory(tenv.inventory_path)  # noqa: E731

    def unhang() -> None:
        tenv.trainer.kill_sessions()
        tenv.evalh.kill_sessions()

    report = ended(
        lambda: relay(inv(), "trainer", ["evalhost"], RelayOptions(jobs=1, stall=2)),
        cleanup=unhang,
    )
    assert not report.ok
    [(name, dest, line)] = report.failures
    assert name == "step_5" and dest == "evalhost"
    assert f"{side}: " in line and "no bytes for 2 s" in line, line
    assert not (tenv.dst / "step_5").exists()  # nothing half-published
    ended(lambda: _lock_freed(tenv), cleanup=unhang)
    tenv.trainer_py = tenv.eval_py = None
    again = ended(lambda: _relay(tenv), cleanup=unhang)
    assert again.ok, again.failures
    assert tree(tenv.dst / "step_5") == files
    return line


def test_a_source_that_stops_sending_is_ended_and_named(tenv):
    files = _checkpoint(tenv)
    tenv.trainer_py = _python(tenv, SILENT_SOURCE, 8 * MiB)
    line = _stalls_then_resumes(tenv, files, "trainer")
    assert "sent no bytes" in line
