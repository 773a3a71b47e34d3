"""A job's folder: where, its state, events and exit (written even on a full disk)."""

from __future__ import annotations

import base64
import errno
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic
from remote.errors import UserError
from remote.protocol import JOB_KINDS, RESULT_FILES, JobState, SpecError, check_job_id
from remote.relay.fdfiles import write_all


def read_json(path: str | os.PathLike) -> Any | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def jobs_root(workdir: str) -> Path:
    return Path(os.path.expanduser(workdir)) / "jobs"


def job_dir(workdir: str, job_id: str) -> Path:
    try:
        return jobs_root(workdir) / check_job_id(job_id)
    except SpecError as exc:
        raise UserError(str(exc)) from None


def existing_job_dir(workdir: str, job_id: str) -> Path:
    path = job_dir(workdir, job_id)
    if not (path / "spec.json").is_file():
        known = sorted(p.name for p in jobs_root(workdir).glob("*") if (p / "spec.json").is_file())
        hint = f" (jobs there: {', '.join(known[-5:])})" if known else " (no jobs there)"
        raise UserError(f"no job {job_id!r} in {jobs_root(workdir)}{hint}")
    return path


def job_kind(spec: object) -> str:
    """The kind of the job `spec` describes (``eval`` when it names none)."""
    kind = spec.get("kind", "eval") if isinstance(spec, dict) else spec
    if kind not in JOB_KINDS:
        raise UserError(f"unknown job kind {kind!r}; one of {', '.join(JOB_KINDS)}")
    return kind


def proc_starttime(pid: int) -> int | None:
    """The kernel's start time of `pid` (None if gone): with it, one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may hold spaces and parentheses; the fields after the last ')' are fixed
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def runner_alive(pid_info: dict | None, runner: dict | None = None) -> bool:
    """Whether the recorded supervisor (pid.json) or runner (runner.json) is alive."""
    return any(
        isinstance(info, dict)
        and isinstance(info.get("pid"), int)
        and proc_starttime(info["pid"]) == info.get("starttime")
        for info in (pid_info, runner)
    )


RUNNER_FILE = "runner.json"


def lost_exit(path: Path, pid_info: object, runner: dict | None) -> dict:
    """The exit record a lost job would have written; said, never written."""
    from remote.jobs import ending

    pid = pid_info.get("pid") if isinstance(pid_info, dict) else None
    pids = [p for p in ((runner or {}).get("pid"), pid) if isinstance(p, int)]
    before = (runner or {}).get("oom_before")
    why = ending.why_lost(pids, before if isinstance(before, dict) else None, path / "log.txt")
    return {"state": JobState.LOST, "code": None, "error": why, "finished": None}


def job_state(path: Path) -> dict:
    """State of the job in `path` plus its last progress; a lost job's ``exit`` says why."""
    spec = read_json(path / "spec.json") or {}
    pid_info = read_json(path / "pid.json")
    exit_info = read_json(path / "exit.json")
    runner = read_json(path / RUNNER_FILE)
    if exit_info:
        state = exit_info.get("state", JobState.FAILED)
    elif pid_info is None:
        state = JobState.STARTING
    elif runner_alive(pid_info, runner):
        state = JobState.RUNNING
    else:
        state = JobState.LOST
        exit_info = lost_exit(path, pid_info, runner if isinstance(runner, dict) else None)
    out = {
        "job_id": path.name,
        "state": state,
        "dir": str(path),
        "created": spec.get("created"),
        "checkpoint": spec.get("checkpoint"),
        "drafter": (spec.get("eval") or {}).get("drafter"),
        "kind": spec.get("kind"),
        "pid": (pid_info or {}).get("pid"),
        "pgid": (pid_info or {}).get("pgid"),
        "exit": exit_info,
        "progress": last_progress(path / "events.jsonl"),
        "has_result": (path / "result.json").is_file(),
    }
    return out


def last_progress(events: Path) -> dict | None:
    """The newest progress-like event (reads only the file's tail)."""
    try:
        with open(events, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") in (
            "sample",
            "ground_truth",
            "phase",
            "start",
            "done",
        ):
            return ev
    return None


def list_jobs(workdir: str) -> list[dict]:
    root = jobs_root(workdir)
    if not root.is_dir():
        return []
    rows = [job_state(p) for p in root.iterdir() if (p / "spec.json").is_file()]
    return sorted(rows, key=lambda r: (r.get("created") or 0, r["job_id"]))


def result_files(path: Path) -> dict[str, str]:
    """The `RESULT_FILES` in `path`, base64, by name; a link planted there is never read."""
    files = {}
    for name in RESULT_FILES:
        try:
            fd = os.open(path / name, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as fh:
            if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                files[name] = base64.b64encode(fh.read()).decode("ascii")
    return files


class EventLog:
    """Appends JSON events to ``events.jsonl``; a refused write raises, leaving no partial line."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        self.write({"event": event, "time": round(time.time(), 3), **fields})

    def write(self, obj: dict) -> None:
        line = (json.dumps(obj, default=str) + "\n").encode()
        with self._lock:
            size = os.fstat(self._fd).st_size
            try:
                write_all(self._fd, line)
            except OSError as exc:
                os.ftruncate(self._fd, size)
                exc.filename = exc.filename or str(self.path)
                raise


# said in the OS's words, instead of dying without exit.json ("lost")
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
EXIT_RESERVE = ".exit.reserve"
EXIT_RESERVE_BYTES = 64 * 1024


def write_error(exc: OSError, where: Path) -> str:
    """One line for an OSError writing in `where`: the OS's words, the errno, the file."""
    name = errno.errorcode.get(exc.errno or 0)
    what = (exc.strerror or str(exc)).lower()
    return f"{what}{f' ({name})' if name else ''} while writing {exc.filename or where}"


def reserve_exit(path: Path) -> None:
    """Keep room in the job folder `path` for its exit.json (`write_exit`)."""
    fd = os.open(path / EXIT_RESERVE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        write_all(fd, b" " * EXIT_RESERVE_BYTES)
    finally:
        os.close(fd)


def write_exit(path: Path, info: dict) -> None:
    """Write exit.json through the reserve, renamed into place: a full disk cannot stop it."""
    data = (json.dumps(info, indent=2, default=str) + "\n").encode()
    try:
        fd = os.open(path / EXIT_RESERVE, os.O_WRONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        write_atomic(path / "exit.json", data)
        return
    try:
        write_all(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    try:
        os.replace(path / EXIT_RESERVE, path / "exit.json")
    except FileNotFoundError:
        pass
