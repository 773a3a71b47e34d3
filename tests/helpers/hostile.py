"""A hostile eval host made of real parts: the host's ``python`` (in a test inventory) is a
wrapper that runs the real bundle and rewrites its answers by a scenario, so a case of a
lying, flooding or silent host is one line. Nothing of the controller is mocked.

    host = HostileHost(tmp_path / "hostile", workdir)
    entry = ssh_host_entry(server, ssh_base, python=host.python, workdir=str(workdir))
    host.play(status={"answer": "[a]"})          # `job status` answers a list
    host.play(watch={"answer": "HANG if a.get('event') == 'watch_end' else a"})
    host.play(list={"print": "(b'x' * MiB for _ in range(50))"})  # 50 MiB, no newline
    ...
    assert host.left_behind() == []

A scenario maps a ``job`` action (``start``, ``status``, ``watch``, ``pull``, ``cancel``,
``list``) to a rule; actions without one, and every other command, run the real bundle
untouched. A rule's keys (python expressions, evaluated on the host):

- ``argv``: the real command's arguments, from ``args`` (e.g. another ``--job-id``);
- ``answer``: each JSON line ``a`` (the ``n``-th) the real command prints becomes this
  value, sent as a JSON line (bytes: sent as they are; ``DROP``: not sent; ``HANG``: from
  here on nothing is sent);
- ``print``: instead of running the real command, send this (text, bytes, or an iterable
  of bytes chunks); how many bytes got out is counted (`written`);
- ``hang``: after the rest, send nothing for this many seconds (or until the controller
  goes away), then exit; ``then: "hang"`` is the same with 600 seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.cli import ROOT

WRAPPER = '''#!{real}
"""A host's python that runs the real bundle and rewrites its job answers (see
tests/helpers/hostile.py)."""
import base64, json, os, select, subprocess, sys, time  # noqa: E401 (names for rules)

REAL = {real!r}
STATE = {state!r}
MiB = 1 << 20
HANG, DROP = object(), object()
args = sys.argv[1:]
action = args[args.index("job") + 1] if "job" in args[:2] and len(args) > 2 else None
try:
    with open(os.path.join(STATE, "scenario.json")) as fh:
        rule = json.load(fh).get(action) if action else None
except (OSError, ValueError):
    rule = None
if not rule:
    os.execv(REAL, [REAL, *args])
with open(os.path.join(STATE, "pids"), "a") as fh:
    fh.write(f"{{os.getpid()}}\\n")
out = sys.stdout.buffer
written = 0
names = {{"base64": base64, "json": json, "time": time, "MiB": MiB, "HANG": HANG, "DROP": DROP}}


def send(data):
    global written
    data = data.encode() if isinstance(data, str) else data
    out.write(data)
    out.flush()
    written += len(data)


def hang(seconds):
    """Send nothing for `seconds`, or until the controller's end of stdout is closed."""
    poll = select.poll()
    poll.register(1, select.POLLERR | select.POLLHUP)
    end = time.monotonic() + seconds
    while time.monotonic() < end and not poll.poll(200):
        pass


proc = None
hung = False
try:
    if "argv" in rule:
        args = eval(rule["argv"], dict(names, args=args))
    if "print" in rule:
        data = eval(rule["print"], names)
        for chunk in [data] if isinstance(data, (str, bytes)) else data:
            send(chunk)
    elif "answer" in rule:
        proc = subprocess.Popen([REAL, *args], stdout=subprocess.PIPE)
        with open(os.path.join(STATE, "pids"), "a") as fh:
            fh.write(f"{{proc.pid}}\\n")
        for n, line in enumerate(iter(proc.stdout.readline, b"")):
            try:
                a = json.loads(line)
            except ValueError:
                send(line)
                continue
            b = eval(rule["answer"], dict(names, a=a, n=n))
            if b is HANG:
                hung = True
                break
            if b is not DROP:
                send(b if isinstance(b, bytes) else json.dumps(b) + "\\n")
    if hung or "hang" in rule or rule.get("then") == "hang":
        hang(float(rule.get("hang", 600)))
except BrokenPipeError:
    pass
finally:
    with open(os.path.join(STATE, f"written-{{os.getpid()}}"), "w") as fh:
        fh.write(str(written))
    if proc is not None and proc.poll() is None:
        proc.kill()
code = proc.wait() if proc is not None else 0
os._exit(code if code >= 0 else 1)
'''


class HostileHost:
    """A wrapper python for one eval host (`python`, for its inventory entry) and the
    scenario it plays (`play`); `workdir` is that host's dflash workdir (its jobs)."""

    def __init__(self, folder: Path, workdir: Path, real: str = sys.executable):
        folder.mkdir(parents=True, exist_ok=True)
        self.state, self.workdir, self.real = folder, Path(workdir), real
        self.python = str(folder / "python")
        Path(self.python).write_text(WRAPPER.format(real=real, state=str(folder)))
        os.chmod(self.python, 0o755)
        self.play()

    def play(self, **rules: dict) -> None:
        """From the next command on, rewrite the answers of these job actions."""
        (self.state / "scenario.json").write_text(json.dumps(rules))

    def written(self) -> int:
        """Bytes the wrappers sent so far (``print`` and ``answer`` rules)."""
        return sum(int(p.read_text() or 0) for p in self.state.glob("written-*"))

    def make_job(self, job_id: str) -> Path:
        """A real job on the host, started by the real ``job start`` and cancelled by the
        real ``job cancel`` once its runner runs (before its torch import is done): the
        files every job command reads, its events ``job`` and ``end``. Returns its folder."""
        spec = self.blocking_spec(job_id)
        self._job("start", job_id, stdin=json.dumps(spec))
        folder = self.workdir / "jobs" / job_id
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and b'"job"' not in _read(folder / "events.jsonl"):
            time.sleep(0.02)
        self._job("cancel", job_id)
        return folder

    def blocking_spec(self, job_id: str) -> dict:
        """An eval job's spec whose runner blocks until cancelled, however fast the eval's
        own checks are: its prompts are a FIFO no one writes."""
        fifo = self.workdir / f"{job_id}-prompts.jsonl"
        fifo.parent.mkdir(parents=True, exist_ok=True)
        if not fifo.exists():
            os.mkfifo(fifo)
        return {
            "kind": "eval",
            "checkpoint": "hostile",
            "created": time.time(),
            "prompts": {"path": str(fifo)},
        }

    def cancel(self, job_id: str) -> None:
        """Stop job `job_id` with the real ``job cancel`` (a case that started one)."""
        self._job("cancel", job_id)

    def left_behind(self, grace: float = 10.0) -> list[str]:
        """What the cases left on the host: wrapper processes (and the real commands
        they ran) still alive after `grace` seconds, and jobs still running; each is
        stopped, and named in the list."""
        pids_file = self.state / "pids"
        pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
        deadline = time.monotonic() + grace
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = []
        for pid in pids:
            if _alive(pid):
                left.append(f"process {pid}")
                os.kill(pid, signal.SIGKILL)
        running = self._running()
        while running and time.monotonic() < deadline:  # a runner failing at its kind
            time.sleep(0.05)
            running = self._running()
        for job_id in running:
            left.append(f"job {job_id}")
            self._job("cancel", job_id)
        return left

    def _running(self) -> list[str]:
        jobs = json.loads(self._job("list") or "[]")
        return [j["job_id"] for j in jobs if j["state"] in ("starting", "running")]

    def _job(self, action: str, job_id: str | None = None, stdin: str | None = None) -> str:
        """The real bundle's ``job <action>`` on this host's workdir (its stdout)."""
        argv = [self.real, "-m", "remote", "job", action, f"--workdir={self.workdir}"]
        return subprocess.run(
            argv + ([f"--job-id={job_id}"] if job_id else []),
            input=stdin,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=action in ("start", "cancel"),
        ).stdout


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def finishes(work: Callable[[], Any], within: float = 120.0) -> Any:
    """`work()`'s value (or its exception), provided it returns within `within` seconds:
    a wait on a host without end fails the test instead of hanging it. (A bound on
    hanging, not on speed: the code under test has far smaller deadlines.)"""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        raise AssertionError(f"still waiting on the host after {within:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]
