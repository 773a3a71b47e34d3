"""``job run``'s supervisor: a runner killed outright still gets ``exit.json``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from remote.atomic import write_json_atomic
from remote.jobs import ending
from remote.jobs.folder import RUNNER_FILE, EventLog, proc_starttime
from remote.jobs.run import finish, run
from remote.parent_death import parent_death_signal
from remote.protocol import JobState


def supervise(path: Path, preflight: bool = False) -> int:
    """Run the job in a forked runner, recording how it ended if it could not; its exit status."""
    before = ending.oom_counters()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    # forked before heavy imports so the OOM killer picks the runner; a supervisor killed
    # outright takes it along
    with_parent = parent_death_signal(signal.SIGKILL)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            if with_parent is not None:
                with_parent()
            code = run(path, preflight)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    signal.signal(signal.SIGTERM, lambda signum, _frame: _forward(child, signum))
    runner = {"pid": child, "starttime": proc_starttime(child), "oom_before": before}
    try:
        write_json_atomic(path / RUNNER_FILE, runner)
    except OSError:
        print(f"job runner pid {child}", flush=True)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if (path / "exit.json").exists():
        return code if code >= 0 else 128 - code
    log = path / "log.txt"
    if code < 0:
        words, code = ending.killed(child, -code, before, log), 128 - code
    else:
        words = {"error": ending.why_exited(child, code, log), "log": str(log)}
    print(f"dflash job supervisor: {words['error']}", flush=True)
    try:
        events = EventLog(path / "events.jsonl")
    except OSError:
        events = None
    finish(path, events, JobState.FAILED, code, words.pop("error"), **words)
    return code


def _forward(child: int, signum: int) -> None:
    """A TERM sent to the supervisor alone reaches the runner, which records the cancel."""
    try:
        os.kill(child, signum)
    except ProcessLookupError:
        pass
