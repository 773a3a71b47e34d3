"""A relay whose stream breaks or stops: it ends, naming the host, and frees the lock.

Over two real loopback sshd hosts, a relay's source session is killed, its file truncated
while it is read, or its destination's session killed, each at a chosen byte of the
stream (a `Progress` hook fires it, so it lands mid-transfer every time); or a host's
``python`` is a wrapper that stops passing bytes on, every pipe left open (a hung host).
Every case must end (a pytest-side limit tells a hang, it is not a timed assertion),
report a failure naming the host, publish nothing, and leave the destination's lock free:
the next relay runs and completes the checkpoint byte-exact. The host side is also run
alone: a lock holder or receiver whose controller falls silent ends by its patience.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from orchestrator.inventory import load_inventory
from orchestrator.relay.run import Progress, RelayOptions, relay
from remote.protocol import FRAME_HEADER as HEADER
from tests.helpers.checkpoints import make_checkpoint, tree
from tests.helpers.cli import ROOT, one_error_line

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

SILENT_DEST = """#!{real}
\"\"\"The eval host's python: relay-lock stops taking its stdin after {after} bytes, every
pipe left open (a host that hangs); the real holder below ends by its own patience.\"\"\"
import os, subprocess, sys
args = sys.argv[1:]
if "relay-lock" not in args:
    os.execv({real!r}, [{real!r}, *args])
proc = subprocess.Popen([{real!r}, *args], stdin=subprocess.PIPE)
got = 0
while got < {after} and (block := os.read(0, 1 << 20)):
    proc.stdin.write(block)
    proc.stdin.flush()
    got += len(block)
sys.exit(proc.wait())
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


def test_a_destination_that_stops_taking_bytes_is_ended_and_its_holder_ends_too(tenv):
    """The controller ends its stream after `stall` s; the host's holder, blocked inside
    a frame, ends by its own patience (twice that) and frees the lock."""
    files = _checkpoint(tenv)
    tenv.eval_py = _python(tenv, SILENT_DEST, 8 * MiB)
    line = _stalls_then_resumes(tenv, files, "evalhost")
    assert "took no bytes" in line


# ---- the host side: a controller that vanished without closing its connection ------------


def _holder(root: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "remote", "relay-lock", *extra, "--", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )


def _ended_alone(proc: subprocess.Popen) -> tuple[int, str]:
    """The exit code and stderr of a host command left with its stdin open and silent."""
    try:
        code = proc.wait(timeout=HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still waiting after {HANG} s") from None
    err = proc.stderr.read().decode()
    proc.stdin.close()
    return code, err


def _lock_is_free(root: Path) -> bool:
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_an_idle_lock_holder_answers_pings_and_ends_when_they_stop(tmp_path):
    root = tmp_path / "drafters"
    proc = _holder(root, "--patience=1")
    assert json.loads(proc.stdout.readline())["locked"] is True
    for _ in range(3):  # pings more often than its patience keep it
        time.sleep(0.6)
        proc.stdin.write(b'{"op": "ping"}\n')
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"pong": True}
    assert not _lock_is_free(root)
    code, err = _ended_alone(proc)  # then silence, the pipe still open: it ends
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and "nothing from the relay's controller" in lines[0]
    assert _lock_is_free(root) and not (root / ".dflash-relay.lock").exists()


def test_a_holder_left_inside_a_frame_ends_and_keeps_its_partial_file(tmp_path):
    root = tmp_path / "drafters"
    proc = _holder(root, "--patience=1")
    assert json.loads(proc.stdout.readline())["locked"] is True
    proc.stdin.write(b'{"op": "recv"}\n')
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    req = json.dumps([{"path": ".partial-step_1/w.bin", "offset": 0}]).encode()
    proc.stdin.write(HEADER.pack(len(req)) + req + HEADER.pack(MiB) + b"x" * 1000)
    proc.stdin.flush()
    done = json.loads(proc.stdout.readline())
    assert done["done"] is True and "nothing from the relay's controller" in done["error"]
    code, _ = _ended_alone(proc)
    assert code == 0 and _lock_is_free(root)
    kept = (root / ".partial-step_1" / "w.bin").read_bytes()  # a clean prefix, to resume
    assert kept == b"x" * len(kept)


def test_a_receiver_left_inside_a_frame_ends_with_one_line(tmp_path):
    root = tmp_path / "drafters"
    root.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "remote", "relay-recv", "--patience=1", "--", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    req = json.dumps([{"path": ".partial-step_1/w.bin", "offset": 0}]).encode()
    proc.stdin.write(HEADER.pack(len(req)) + req + HEADER.pack(MiB) + b"x" * 1000)
    proc.stdin.flush()
    code, err = _ended_alone(proc)
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and "nothing from the relay's controller" in lines[0]


def test_a_relay_that_plans_longer_than_the_hosts_patience_keeps_its_lock(tenv):
    """The lock is taken while the trainer's young checkpoint is looked at twice, 4 s
    apart; the holder's patience is 2 s: the relay's pings keep it."""
    files = make_checkpoint(tenv.ckpt, "step_6", {"w.bin": MiB}, marker=False)
    doc = yaml.safe_load(tenv.inventory_path.read_text())
    doc["hosts"]["trainer"]["roles"]["trainer"].update(complete_rule="stable", stable_seconds=4)
    path = tenv.tmp / "inventory-stable.yaml"
    path.write_text(yaml.safe_dump(doc))
    inv = load_inventory(path)
    report = ended(
        lambda: relay(inv, "trainer", ["evalhost"], RelayOptions(jobs=1, stall=1)),
        cleanup=tenv.evalh.kill_sessions,
    )
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_6") == files
