"""``job run``: the detached runner; it runs the job's kind and always ends with ``exit.json``."""

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
    """The job's kind's work; with `preflight`, the host checks first into ``preflight.json``."""
    spec = read_json(path / "spec.json")
    events = EventLog(path / "events.jsonl")
    cancelled = {"flag": False}

    def on_term(signum, _frame):
        # recorded here once, so the state is exact even if nobody waits
        if cancelled["flag"]:
            return
        cancelled["flag"] = True
        finish(path, events, JobState.CANCELLED, 128 + signum, "cancelled by request")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
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
        finish(path, events, JobState.FAILED, 3, write_error(exc, path))
        return 3
    except Exception as exc:
        return _failed_by_bug(path, events, exc)


def kind_runner(kind: str):
    """The function that runs a job of `kind`, imported only when one runs."""
    if kind == JobKind.EVAL:
        from remote.eval.job import run_job
    elif kind == JobKind.ONLINE:
        from remote.online.job import run_job
    else:
        from remote.eval.parity import run_job
    return run_job


def _failed_by_bug(path: Path, events: EventLog, exc: Exception) -> int:
    """A bug: its traceback in the log, one line in exit.json."""
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
    """Record how the job ended: an ``end`` event if the disk takes it, and exit.json."""
    if (path / "exit.json").exists():
        return
    error = error if error is None or len(error) <= 4000 else error[:3997] + "..."
    info = {"state": state, "code": code, "error": error, "finished": time.time(), **more}
    try:
        if events is not None:
            events.emit("end", **info)
    except OSError:
        pass
    write_exit(path, info)
