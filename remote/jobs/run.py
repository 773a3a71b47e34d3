"""``job run``: the detached runner. It runs the job's kind and always ends with
``exit.json`` (done, failed or cancelled), whatever happens: a one-line error, a full
disk, a bug (its traceback in ``log.txt``) or a TERM from ``job cancel``."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from remote.errors import UserError
from remote.jobs.folder import (
    STORAGE_ERRNOS,
    EventLog,
    job_kind,
    read_json,
    write_error,
    write_exit,
)
from remote.protocol import JobKind, JobState


def run(path: Path, preflight: bool = False) -> int:
    """The job itself: its kind's work (`kind_runner`); always ends with ``exit.json``.
    With `preflight`, the host-side checks first, their outcome in ``preflight.json`` (the
    starting ``job start`` waits for it)."""
    spec = read_json(path / "spec.json")
    events = EventLog(path / "events.jsonl")
    cancelled = {"flag": False}

    def on_term(signum, _frame):
        # `job cancel` signals the whole group; children get the same signal. Record the
        # cancellation here so the state is exact even if nobody waits for us. Once: the
        # supervisor passes the same TERM on.
        if cancelled["flag"]:
            return
        cancelled["flag"] = True
        finish(path, events, JobState.CANCELLED, 128 + signum, "cancelled by request")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal; never die with a session
    events.emit(
        "job", state=JobState.RUNNING, job_id=path.name, pid=os.getpid(), pgid=os.getpgid(0)
    )
    try:
        if spec is None:
            raise UserError(f"{path}/spec.json is missing or not JSON")
        code = kind_runner(job_kind(spec))(path, spec, events, preflight=preflight)
        finish(
            path,
            events,
            JobState.DONE if code == 0 else JobState.FAILED,
            code,
            None if code == 0 else f"the job ended with code {code}",
        )
        return code
    except UserError as exc:
        finish(path, events, JobState.FAILED, 3, str(exc))
        return 3
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:
            return _failed_by_bug(path, events, exc)
        # the host's storage refused a write (a full disk): not a bug, said as the OS says
        finish(path, events, JobState.FAILED, 3, write_error(exc, path))
        return 3
    except Exception as exc:
        return _failed_by_bug(path, events, exc)


def kind_runner(kind: str):
    """The function that runs a job of `kind` (`job_kind`): ``(path, spec,
    events, preflight=...) -> exit code``, imported only when a job of that kind runs."""
    if kind == JobKind.EVAL:
        from remote.eval.job import run_job
    elif kind == JobKind.ONLINE:
        from remote.online.job import run_job
    else:  # parity-capture, parity-compare
        from remote.eval.parity import run_job
    return run_job


def _failed_by_bug(path: Path, events: EventLog, exc: Exception) -> int:
    """A bug: its traceback in the log (when the log can still be written), one line in
    exit.json."""
    try:
        traceback.print_exc()
        sys.stdout.flush()
    except OSError:
        pass
    finish(path, events, JobState.FAILED, 1, f"{type(exc).__name__}: {exc}")
    return 1


def finish(
    path: Path, events: EventLog | None, state: str, code: int, error: str | None, **more
) -> None:
    """Record how the job ended: an ``end`` event (when the disk takes it) and exit.json
    (always: `write_exit`); `more`: what else the record says (a killed runner's
    ``signal``, ``oom``, ``log``)."""
    if (path / "exit.json").exists():
        return
    error = error if error is None or len(error) <= 4000 else error[:3997] + "..."
    info = {"state": state, "code": code, "error": error, "finished": time.time(), **more}
    try:
        if events is not None:
            events.emit("end", **info)
    except OSError:  # a full disk: exit.json has room kept for it, and says the same
        pass
    write_exit(path, info)
