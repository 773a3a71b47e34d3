"""``job run``'s two processes: a small supervisor that forks the runner (`remote.jobs.run`)
and waits for it, so that a runner killed outright (SIGKILL, the OOM killer, a crash in
native code) still leaves an ``exit.json`` saying by which signal, whether the kernel
says it was out of memory, and where its log is (`remote.jobs.ending`).

The supervisor forks before anything heavy is imported (it stays a few MiB, so the OOM
killer picks the runner, not it), records the runner in ``runner.json`` with the kernel's
OOM counters at the start, passes a TERM on to the runner (a cancel, as the runner's own
handler records it), and returns the runner's exit status (128 + the signal for a
signal). Both are in the job's process group: ``job cancel`` reaches them together; a
supervisor killed alone takes the runner along (``PR_SET_PDEATHSIG``)."""

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
    """Run the job in `path` in a forked runner and record how it ended if it could not
    (see the module docstring); its exit status."""
    before = ending.oom_counters()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    # A supervisor killed outright takes its runner along (then the job is lost, and its
    # status says so): never a runner left working unwatched.
    with_parent = parent_death_signal(signal.SIGKILL)
    child = os.fork()
    if child == 0:  # the runner
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
    except OSError:  # a full disk: the runner says so itself; its pid is in the log below
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
    print(f"dflash job supervisor: {words['error']}", flush=True)  # into log.txt, for people
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
