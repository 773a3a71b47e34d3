"""``job``: long-running work on a host, detached from the SSH session that started it.

A job lives in ``<workdir>/jobs/<job-id>/``::

    spec.json        what to do (written once, by ``job start``)
    pid.json         {pid, pgid, starttime, started}: the runner, its process group
    preflight.json   the host checks' report (``job start --preflight``)
    log.txt          the runner's stdout/stderr, for people
    events.jsonl     progress events, one JSON object a line, appended as they happen
    ground_truth.json  where the ground truth came from (kind, url, cache key, warnings)
    eval_spec.json   the spec handed to the eval engine
    result.json      the engine's result (schema dflash.eval/1), when it finished
    samples.jsonl    the engine's per-sample records
    exit.json        {state: done|failed|cancelled, code, error, finished}: written last

``job start`` creates the folder, spawns ``job run`` in a NEW SESSION (``setsid``: its own
process group, no controlling terminal, stdin from /dev/null, output to ``log.txt``) and
returns at once, so a dropped connection or a killed controller never reaches the job
(``--follow``: it then goes on as ``job watch`` in the same SSH command, one round trip
less). ``job watch`` follows ``events.jsonl`` from a byte offset and ends with one
``watch_end`` event (``--pull``: carrying the result files, so no further round trip);
``job pull`` prints the state and the result files;
``job cancel`` signals the whole process group (TERM, then KILL) and waits until no member
is left; ``job list`` and ``job status`` report state: ``running`` (the recorded runner
is alive: same pid AND same start time, so a reused pid is not mistaken for it), ``done``,
``failed``, ``cancelled`` or ``lost`` (the runner died without writing ``exit.json``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic, write_json_atomic
from remote.errors import UserError
from remote.protocol import (
    CARRY_DIRS,
    CARRY_MAX_BYTES,
    GT_DEFERRED_FILE,
    JOB_CARRY_KEY,
    JOB_KINDS,
    RESULT_FILES,
    TERMINAL_STATES,
    WATCH_END_EVENT,
    WATCH_HEARTBEAT_SECONDS,
    EvalSpec,
    SpecError,
    carried_name_problem,
    check_job_id,
)
from remote.relay.fdfiles import write_all

HEARTBEAT_SECONDS = WATCH_HEARTBEAT_SECONDS
# A watcher reads new events this often (a stat and a read: cheap), and the job's full state
# (pid, start time, exit) at least this often, to notice a runner that died silently.
WATCH_POLL_SECONDS = 0.05
STATE_POLL_SECONDS = 1.0
# Files a finished job leaves in its folder that belong with the result on the workstation.
CANCEL_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0  # after SIGKILL: only a process stuck in the kernel outlives it


# ---- small helpers ----------------------------------------------------------------------


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


def self_command() -> list[str]:
    """The argv prefix that runs this very bundle again with the same python.

    Inside a zipapp ``remote`` lives at ``<bundle>.pyz/remote``; run from a source tree it
    is a package importable with ``-m remote``.
    """
    pkg = Path(__file__).resolve().parent
    bundle = pkg.parent
    if bundle.is_file():
        return [sys.executable, str(bundle)]
    return [sys.executable, "-m", "remote"]


def _source_env() -> dict[str, str]:
    """Environment for child processes; from a source tree, keep `remote` importable."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent
    if root.is_dir():
        env["PYTHONPATH"] = str(root) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
    return env


def proc_starttime(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if it is gone.

    Together with the pid it identifies one process for good: a recycled pid has a
    different start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses; fields after the last ')' are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has finished; only its parent has not reaped it yet
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


def runner_alive(pid_info: dict | None) -> bool:
    if not pid_info:
        return False
    return proc_starttime(int(pid_info["pid"])) == pid_info.get("starttime")


def job_state(path: Path) -> dict:
    """State of the job in `path` (see the module docstring) plus its last progress."""
    spec = read_json(path / "spec.json") or {}
    pid_info = read_json(path / "pid.json")
    exit_info = read_json(path / "exit.json")
    if exit_info:
        state = exit_info.get("state", "failed")
    elif pid_info is None:
        state = "starting"
    elif runner_alive(pid_info):
        state = "running"
    else:
        state = "lost"
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


# ---- writes that can fail: a full disk is said, never lost ----------------------------

# Errors of a write the host's storage refused: the job says so in the OS's words and
# where, instead of dying without exit.json ("lost").
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
# Room kept in a job's folder from its start for its exit.json: a job that fills its disk
# still records how it ended (overwriting blocks it already holds needs no new ones).
EXIT_RESERVE = ".exit.reserve"
EXIT_RESERVE_BYTES = 64 * 1024


def write_error(exc: OSError, where: Path) -> str:
    """One line for an OSError writing in `where` on this host: the OS's words, the
    errno's name and the file (``no space left on device (ENOSPC) while writing
    /data/.dflash/jobs/J/samples.jsonl``)."""
    name = errno.errorcode.get(exc.errno or 0)
    what = (exc.strerror or str(exc)).lower()
    return f"{what}{f' ({name})' if name else ''} while writing {exc.filename or where}"


def reserve_exit(path: Path) -> None:
    """Keep `EXIT_RESERVE_BYTES` in the job folder `path` for its exit.json (`write_exit`)."""
    fd = os.open(path / EXIT_RESERVE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        write_all(fd, b" " * EXIT_RESERVE_BYTES)
    finally:
        os.close(fd)


def write_exit(path: Path, info: dict) -> None:
    """Write exit.json into the job folder `path`: into the space `reserve_exit` kept,
    then renamed into place (a reader never sees half of it), so it is written even when
    the disk is full; a folder without a reserve gets it the ordinary way."""
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
    except FileNotFoundError:  # another writer (a cancel, the runner's TERM) just did
        pass


# ---- start ------------------------------------------------------------------------------


def start(workdir: str, job_id: str, spec: dict, preflight: bool = False) -> dict:
    """Create the job folder, spawn the detached runner, return {job_id, dir, pid, pgid}.

    With `preflight`, the runner first runs the host-side checks (`remote.eval.preflight.check`)
    and this call waits for their outcome: a failure is raised as its one line and the job
    folder is removed (no job was started), a success is in the answer (``preflight``). The
    checks then share the runner's python and torch import instead of paying for their own.
    """
    path = job_dir(workdir, job_id)
    # a bad kind or engine spec is refused here, before a folder or a process exists
    if not isinstance(spec, dict) or spec.get("kind", "eval") not in JOB_KINDS:
        kind = spec.get("kind") if isinstance(spec, dict) else spec
        raise UserError(f"unknown job kind {kind!r}; one of {', '.join(JOB_KINDS)}")
    threads = job_engine(spec).threads if "eval" in spec else None
    spec = dict(spec)
    try:
        write_carried(workdir, spec.pop(JOB_CARRY_KEY, None) or [])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        raise UserError(
            f"job {job_id!r} already exists in {path.parent}; pick another id"
        ) from None
    except OSError as exc:  # e.g. a full disk: said as the OS says it, with where
        raise UserError(f"cannot start the job: {write_error(exc, path.parent)}") from None
    try:
        return _spawn(path, workdir, job_id, spec, threads, preflight)
    except OSError as exc:  # no room for the job's first files: nothing is left started
        shutil.rmtree(path, ignore_errors=True)
        raise UserError(f"cannot start the job: {write_error(exc, path)}") from None


def _spawn(
    path: Path, workdir: str, job_id: str, spec: dict, threads: int | None, preflight: bool
) -> dict:
    """`start`'s second half, in the job's new folder `path`: its files, its runner."""
    reserve_exit(path)
    spec = dict(spec, job_id=job_id, workdir=str(Path(os.path.expanduser(workdir))))
    prompts = spec.get("prompts")
    if isinstance(prompts, dict) and isinstance(prompts.get("path"), str):
        # The controller names a carried file under the workdir as its inventory does
        # (``~/.dflash/...``: no home lookup there); the job records the real path.
        spec["prompts"] = dict(prompts, path=os.path.expanduser(prompts["path"]))
    write_json_atomic(path / "spec.json", spec)
    log = open(path / "log.txt", "ab")
    env = _source_env()
    if threads:  # the runner imports torch and runs the engine itself
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    proc = subprocess.Popen(
        [
            *self_command(),
            "job",
            "run",
            "--dir",
            str(path),
            *(["--preflight"] if preflight else []),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        cwd=str(path),
        env=env,
    )
    log.close()
    starttime = None
    for _ in range(100):  # /proc entry appears with the fork; a few ms at most
        starttime = proc_starttime(proc.pid)
        if starttime is not None or proc.poll() is not None:
            break
        time.sleep(0.01)
    info = {"pid": proc.pid, "pgid": proc.pid, "starttime": starttime, "started": time.time()}
    try:
        write_json_atomic(path / "pid.json", info)
    except OSError:  # a runner nobody could find again is not left running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if preflight:  # waits for the runner's checks, and notices a runner that died first
        info["preflight"] = _preflight_outcome(path, proc)
        return {"job_id": job_id, "dir": str(path), **info}
    # The runner may have died already (bad python, import error): say so now.
    time.sleep(0.05)
    if proc.poll() not in (None, 0) and not (path / "exit.json").exists():
        tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
        raise UserError(
            f"job runner exited at once with code {proc.returncode}: "
            f"{tail[0] if tail else 'no output'}"
        )
    return {"job_id": job_id, "dir": str(path), **info}


def write_carried(workdir: str, carried: list) -> list[Path]:
    """Write the input files a job start carries (`remote.protocol.JOB_CARRY_KEY`): each
    ``{"path", "sha256", "data"}`` (data base64) goes to its path when no file is there yet.

    The controller names the paths; this host checks them: a plain name directly inside
    one of `CARRY_DIRS` under `workdir`, the data no bigger than `CARRY_MAX_BYTES` and
    hashing to its ``sha256``. Written through a temp file and a rename (never through a
    link planted at the name). A bad entry is one line and nothing of the job is made."""
    if not isinstance(carried, list):
        raise UserError("job spec: carried files must be a list")
    if not carried:
        return []
    root = Path(os.path.expanduser(workdir))
    allowed = set()
    for d in CARRY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
        allowed.add((root / d).resolve())
    checked = []
    for item in carried:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("path", "sha256", "data")
        ):
            raise UserError("job spec: a carried file needs path, sha256 and data (strings)")
        path = Path(os.path.expanduser(item["path"]))
        where = path.parent.resolve()
        why = carried_name_problem(path.name) or (None if where in allowed else "is elsewhere")
        if why:
            raise UserError(
                f"job spec: carried file {item['path']!r} is not a plain name in "
                f"{', '.join(str(root / d) for d in CARRY_DIRS)} (it {why})"
            )
        try:
            data = base64.b64decode(item["data"], validate=True)
        except (binascii.Error, ValueError):
            raise UserError(f"job spec: carried file {path.name} is not base64") from None
        if len(data) > CARRY_MAX_BYTES or hashlib.sha256(data).hexdigest() != item["sha256"]:
            raise UserError(
                f"job spec: carried file {path.name} does not match its sha256 "
                f"(or is over {CARRY_MAX_BYTES} bytes); nothing was started"
            )
        checked.append((where / path.name, data))
    for target, data in checked:
        if not target.is_file() or target.is_symlink():  # content-addressed: there is done
            write_atomic(target, data)
    return [t for t, _ in checked]


# Under the controller's 120 s limit on `job start`, as the separate preflight had.
PREFLIGHT_WAIT_SECONDS = 110.0


def _preflight_outcome(path: Path, proc: subprocess.Popen) -> dict:
    """The runner's preflight report (``preflight.json``), once it is written. A failed
    check (or a runner that died first) is raised as one line after the runner has exited
    and the job folder is gone."""
    deadline = time.monotonic() + PREFLIGHT_WAIT_SECONDS
    outcome = None
    while time.monotonic() < deadline:
        outcome = read_json(path / "preflight.json")
        if outcome is not None or proc.poll() is not None:
            outcome = outcome or read_json(path / "preflight.json")
            break
        time.sleep(0.02)
    if isinstance(outcome, dict) and outcome.get("ok"):
        return outcome
    timed_out = outcome is None and proc.poll() is None
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if timed_out:
        error = (
            f"the host checks (python, torch import, the target's config) took more than "
            f"{PREFLIGHT_WAIT_SECONDS:g}s; is the host overloaded? Nothing was started"
        )
    elif isinstance(outcome, dict) and outcome.get("error"):
        error = str(outcome["error"])
    elif (read_json(path / "exit.json") or {}).get("error"):  # e.g. its disk was full
        error = str(read_json(path / "exit.json")["error"])
    else:
        tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
        error = (
            f"job runner exited with code {proc.returncode} during its host checks: "
            f"{tail[0] if tail else 'no output'}"
        )
    shutil.rmtree(path, ignore_errors=True)  # nothing was started: leave no job behind
    raise UserError(error)


# ---- run (inside the detached process) ----------------------------------------------------


class EventLog:
    """Appends JSON events to ``events.jsonl``, one line each, written as they happen. A
    write the disk refuses raises its OSError (naming the file) and leaves no part of its
    line behind: the file stays whole lines, and a later event may still fit."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        self._lock = threading.Lock()  # a line at a time, whichever thread emits it

    def emit(self, event: str, **fields: Any) -> None:
        self.write({"event": event, "time": round(time.time(), 3), **fields})

    def write(self, obj: dict) -> None:
        line = (json.dumps(obj, default=str) + "\n").encode()
        with self._lock:
            size = os.fstat(self._fd).st_size
            try:
                write_all(self._fd, line)
            except OSError as exc:
                os.ftruncate(self._fd, size)  # the part of the line that fitted
                exc.filename = exc.filename or str(self.path)
                raise


def run(path: Path, preflight: bool = False) -> int:
    """The job itself: ground truth, then the eval engine; always ends with ``exit.json``.
    With `preflight`, the host-side checks first, their outcome in ``preflight.json`` (the
    starting ``job start`` waits for it)."""
    spec = read_json(path / "spec.json")
    events = EventLog(path / "events.jsonl")
    cancelled = {"flag": False}

    def on_term(signum, _frame):
        # `job cancel` signals the whole group; children get the same signal. Record the
        # cancellation here so the state is exact even if nobody waits for us.
        cancelled["flag"] = True
        finish(path, events, "cancelled", 128 + signum, "cancelled by request")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal; never die with a session
    events.emit("job", state="running", job_id=path.name, pid=os.getpid())
    try:
        if spec is None:
            raise UserError(f"{path}/spec.json is missing or not JSON")
        kind = spec.get("kind", "eval")
        if kind not in JOB_KINDS:
            raise UserError(f"unknown job kind {kind!r}; one of {', '.join(JOB_KINDS)}")
        if kind != "eval":
            from remote.eval.parity import run_job as run_parity_job

            code = run_parity_job(path, spec, events)
        else:
            engine = job_engine(spec)  # the job's EvalSpec, read once for every phase
            checked: dict = {}
            if preflight:
                _run_preflight(path, spec, engine, checked)
            code = run_eval_job(path, spec, events, engine, checked.get("plan"))
        finish(
            path,
            events,
            "done" if code == 0 else "failed",
            code,
            None if code == 0 else f"the job ended with code {code}",
        )
        return code
    except UserError as exc:
        finish(path, events, "failed", 3, str(exc))
        return 3
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:
            return _failed_by_bug(path, events, exc)
        # the host's storage refused a write (a full disk): not a bug, said as the OS says
        finish(path, events, "failed", 3, write_error(exc, path))
        return 3
    except Exception as exc:
        return _failed_by_bug(path, events, exc)


def _failed_by_bug(path: Path, events: EventLog, exc: Exception) -> int:
    """A bug: its traceback in the log (when the log can still be written), one line in
    exit.json."""
    try:
        traceback.print_exc()
        sys.stdout.flush()
    except OSError:
        pass
    finish(path, events, "failed", 1, f"{type(exc).__name__}: {exc}")
    return 1


def _run_preflight(path: Path, spec: dict, engine: EvalSpec, keep: dict) -> None:
    from remote.eval import preflight

    try:
        report = preflight.check(spec, engine, keep)
    except UserError as exc:
        write_json_atomic(path / "preflight.json", {"ok": False, "error": str(exc)})
        raise
    write_json_atomic(path / "preflight.json", report)


def finish(path: Path, events: EventLog, state: str, code: int, error: str | None) -> None:
    """Record how the job ended: an ``end`` event (when the disk takes it) and exit.json
    (always: `write_exit`)."""
    if (path / "exit.json").exists():
        return
    error = error if error is None or len(error) <= 4000 else error[:3997] + "..."
    info = {"state": state, "code": code, "error": error, "finished": time.time()}
    try:
        events.emit("end", **info)
    except OSError:  # a full disk: exit.json has room kept for it, and says the same
        pass
    write_exit(path, info)


def job_engine(spec: dict) -> EvalSpec:
    """The engine's `EvalSpec` the job carries (``eval``: target, drafter, dtype, threads,
    budgets, ...), validated; a bad one fails the job in one line."""
    try:
        return EvalSpec.of_job(spec)
    except (SpecError, TypeError) as exc:
        raise UserError(f"job spec: {exc}") from None


def run_eval_job(
    path: Path,
    spec: dict,
    events: EventLog,
    engine: EvalSpec | None = None,
    plan: tuple | None = None,
) -> int:
    """Phase 1: ground truth (cached on the host). Phase 2: the eval engine, IN this process
    (one python start and one torch import per job, not two), its events appended to
    ``events.jsonl`` with the time they happened. Its one-line errors fail the job as the
    runner's own do. `engine`: the job's EvalSpec when the caller read it already. The
    target is loaded once (`remote.eval.target`), before the engine, from `plan` (the host
    checks' description of it) when given: a local ground truth generates with the target
    the engine then evaluates with, and a server's or a deferred file's ground truth is
    made or awaited while it loads."""
    from remote.eval import engine as evaluate
    from remote.eval import groundtruth

    engine = engine or job_engine(spec)
    loaded: list = []

    def load_model():
        if not loaded:
            import torch

            from remote.eval import target as target_mod

            dtype = getattr(torch, engine.dtype)
            loaded.append(target_mod.load_target(engine.target, dtype, plan))
        return loaded[0].model

    gt = spec.get("ground_truth") or {}
    if gt.get("kind") == "file" and gt.get("deferred"):
        # Its target is loaded while the ground truth is still on its way.
        load_model()
        events.emit("phase", phase="await_ground_truth")
        arrived = await_file(path / GT_DEFERRED_FILE, float(gt["deferred"]))
        spec = dict(spec, ground_truth=dict(gt, path=str(arrived)))
    loading = None
    if gt.get("kind") in groundtruth.SERVER_KINDS and spec.get("stop_after") != "ground_truth":
        # A server makes the ground truth: the target loads here meanwhile (this process
        # only waits for answers), not after it.
        loading = _in_background(load_model)
    events.emit("phase", phase="ground_truth", source=gt.get("kind"))
    gt_path, gt_info = groundtruth.prepare(
        spec, emit=events.emit, engine=engine, load_model=load_model
    )
    write_json_atomic(path / "ground_truth.json", gt_info)
    if spec.get("stop_after") == "ground_truth":
        return 0
    if loading is not None:
        loading()  # its error, if any, is the job's
    # The job's spec with this host's paths: passed to the engine as it is (and kept).
    engine = build_eval_spec(path, engine, gt_path)
    write_json_atomic(path / "eval_spec.json", engine.to_json())
    events.emit("phase", phase="eval")
    evaluate.run_eval(
        engine,
        on_event=lambda ev: events.write({**ev, "time": round(time.time(), 3)}),
        target=loaded[0] if loaded else None,
    )
    # A ground truth the target disagrees with wholesale is flagged and leaves the cache.
    gt_info = groundtruth.judge_job(gt_info, path, emit=events.emit)
    write_json_atomic(path / "ground_truth.json", gt_info)
    annotate_result(path / "result.json", gt_info, spec, engine)
    return 0


def _in_background(work: Callable[[], Any]) -> Callable[[], Any]:
    """Start `work` in a daemon thread; the returned function waits for it and gives its
    value or raises its exception."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the waiter, raised there
            box["error"] = exc

    thread = threading.Thread(target=run, name="load-target", daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return wait


AWAIT_POLL_SECONDS = 0.02


def await_file(file: Path, limit: float) -> Path:
    """`file` once it exists (a deferred ground truth: pushed whole, by a rename); a one-line
    error after `limit` seconds without it."""
    deadline = time.monotonic() + limit
    while not file.is_file():
        if time.monotonic() > deadline:
            raise UserError(
                f"the ground truth for this job did not arrive in {limit:g}s "
                f"({file.name} in {file.parent}); was its controller stopped?"
            )
        time.sleep(AWAIT_POLL_SECONDS)
    return file


def build_eval_spec(path: Path, engine: EvalSpec, gt_path: str) -> EvalSpec:
    """The engine's spec: the job's, with this host's ground-truth file and output folder."""
    return replace(engine, ground_truth=gt_path, output_dir=str(path))


def annotate_result(result_path: Path, gt_info: dict, spec: dict, engine: EvalSpec) -> None:
    """Make sure the result names its ground-truth source and the job that produced it,
    whatever the engine recorded itself."""
    result = read_json(result_path)
    if not isinstance(result, dict):
        return
    inputs = result.setdefault("inputs", {})
    inputs.setdefault("ground_truth_source", gt_info)
    inputs.setdefault(
        "eval_engine",
        {
            "name": "dflash offline walk (remote.eval.engine)",
            "bundle": Path(self_command()[-1]).name,
        },
    )
    inputs.setdefault("checkpoint", spec.get("checkpoint"))
    inputs.setdefault("prompts", spec.get("prompts"))
    _record_identities(inputs, gt_info, engine)
    result.setdefault(
        "job",
        {
            "job_id": result_path.parent.name,
            "host": spec.get("host"),
            "created": spec.get("created"),
        },
    )
    write_json_atomic(result_path, result)


def _record_identities(inputs: dict, gt_info: dict, engine: EvalSpec) -> None:
    """What a paired comparison and a tracker need to know the run by: the drafter's
    sha256 and step, the ground truth file's sha256, the target's identity."""
    from remote.eval import groundtruth, provenance

    if engine.drafter and "drafter_identity" not in inputs:
        try:
            inputs["drafter_identity"] = provenance.drafter_identity(engine.drafter)
        except OSError as exc:  # the result stands without it; say why it is missing
            inputs["drafter_identity"] = {"sha256": None, "error": str(exc)}
    if gt_info.get("file") and "ground_truth_sha256" not in inputs:
        try:
            inputs["ground_truth_sha256"] = provenance.file_sha256(gt_info["file"])
        except OSError:
            inputs["ground_truth_sha256"] = None
    if engine.target and "target_identity" not in inputs:
        try:
            inputs["target_identity"] = groundtruth.target_identity(engine.target)
        except UserError:
            inputs["target_identity"] = None


# ---- watch / cancel / list --------------------------------------------------------------


def watch(
    path: Path,
    offset: int,
    out: Callable[[str], None],
    poll: float = WATCH_POLL_SECONDS,
    pull: bool = False,
) -> dict:
    """Print events from byte `offset` on as they are appended; end with a ``watch_end``
    event carrying the final state (and with `pull`, the result files: `result_files`).
    New events are looked for every `poll` seconds; the job's full state is read when
    the runner's ``end`` event or ``exit.json`` appears, and every few polls otherwise.
    A heartbeat every few seconds makes a watcher whose controller went away die on the
    broken pipe instead of lingering."""
    events = path / "events.jsonl"
    buf = b""
    last_beat = last_state = time.monotonic()
    ended = False

    def drain() -> None:
        nonlocal offset, buf, ended
        try:
            with open(events, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return
        offset += len(data)
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                ended = ended or line.startswith(b'{"event": "end"')
                out(line.decode(errors="replace"))

    while True:
        drain()
        now = time.monotonic()
        if ended or now - last_state >= STATE_POLL_SECONDS or (path / "exit.json").exists():
            last_state = now
            state = job_state(path)
            if state["state"] in TERMINAL_STATES:
                drain()
                end = {
                    "event": WATCH_END_EVENT,
                    "state": state["state"],
                    "offset": offset,
                    "exit": state["exit"],
                    "has_result": state["has_result"],
                    "dir": str(path),
                }
                if pull:
                    end["files"] = result_files(path)
                out(json.dumps(end))
                return end
        if now - last_beat > HEARTBEAT_SECONDS:
            out(json.dumps({"event": "heartbeat", "offset": offset}))
            last_beat = now
        time.sleep(poll)


def result_files(path: Path) -> dict[str, str]:
    """The `RESULT_FILES` present in the job folder `path`, base64, by name. Only regular
    files, opened without following a symlink: a link planted there is never read."""
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


def cancel(path: Path) -> dict:
    """Stop the job and every process in its group: TERM, a grace period, then KILL; a
    process still there `KILL_WAIT_SECONDS` after KILL is one line (never a wait without
    end)."""
    state = job_state(path)
    pid_info = read_json(path / "pid.json")
    if not pid_info or (state["state"] in TERMINAL_STATES and not group_members(pid_info["pgid"])):
        # nothing runs (a job still "starting" has no runner yet: it is marked, not killed)
        if state["state"] not in TERMINAL_STATES:
            write_exit(path, _cancelled())
        now = job_state(path)["state"]
        return {"job_id": path.name, "state": now, "was": state["state"], "killed": 0}
    pgid = int(pid_info["pgid"])
    victims = group_members(pgid)
    if runner_alive(pid_info) or victims:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + CANCEL_GRACE_SECONDS
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_members(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + KILL_WAIT_SECONDS
            while group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = group_members(pgid)
            if left:
                raise UserError(
                    f"{len(left)} process(es) of job {path.name} (pids "
                    f"{', '.join(map(str, left))}) still alive {KILL_WAIT_SECONDS:g}s after "
                    "SIGKILL: stuck in the kernel (I/O?); check the host"
                )
    if not (path / "exit.json").exists():
        write_exit(path, _cancelled())
    return {
        "job_id": path.name,
        "state": job_state(path)["state"],
        "was": state["state"],
        "killed": len(victims),
        "pgid": pgid,
    }


def _cancelled() -> dict:
    return {
        "state": "cancelled",
        "code": -signal.SIGKILL,
        "error": "cancelled by request",
        "finished": time.time(),
    }


def list_jobs(workdir: str) -> list[dict]:
    root = jobs_root(workdir)
    if not root.is_dir():
        return []
    rows = [job_state(p) for p in root.iterdir() if (p / "spec.json").is_file()]
    return sorted(rows, key=lambda r: (r.get("created") or 0, r["job_id"]))


# ---- command line -----------------------------------------------------------------------


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _cmd(args: argparse.Namespace) -> int:
    action = args.action
    if action == "start":
        data = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
        try:
            spec = json.loads(data)
        except ValueError as exc:
            raise UserError(f"job spec is not JSON: {exc}") from None
        info = start(args.workdir, args.job_id, spec, args.preflight)
        _print(json.dumps(info))
        if args.follow:
            _watch(Path(info["dir"]), 0, args.pull)
    elif action == "run":
        return run(Path(args.dir), args.preflight)
    elif action == "watch":
        _watch(existing_job_dir(args.workdir, args.job_id), args.offset, args.pull)
    elif action == "pull":
        path = existing_job_dir(args.workdir, args.job_id)
        _print(json.dumps({**job_state(path), "files": result_files(path)}))
    elif action == "status":
        _print(json.dumps(job_state(existing_job_dir(args.workdir, args.job_id))))
    elif action == "cancel":
        _print(json.dumps(cancel(existing_job_dir(args.workdir, args.job_id))))
    elif action == "list":
        _print(json.dumps(list_jobs(args.workdir)))
    return 0


def _watch(path: Path, offset: int, pull: bool) -> None:
    try:
        watch(path, offset, _print, pull=pull)
    except BrokenPipeError:  # the controller went away; the job is unaffected
        os._exit(0)


def register(sub) -> None:
    p = sub.add_parser("job", help="start, watch, cancel and list detached jobs")
    p.add_argument("action", choices=["start", "run", "watch", "status", "pull", "cancel", "list"])
    p.add_argument("--workdir", default="~/.dflash")
    p.add_argument("--job-id")
    p.add_argument("--spec", default="-", help="job spec JSON file, or - for stdin")
    p.add_argument("--dir", help="job folder (run only)")
    p.add_argument("--offset", type=int, default=0, help="byte offset into events (watch)")
    p.add_argument(
        "--preflight",
        action="store_true",
        help="run the host checks first; start waits for them (start, run)",
    )
    p.add_argument("--follow", action="store_true", help="after starting, watch the job (start)")
    p.add_argument(
        "--pull",
        action="store_true",
        help="end the watch with the result files, base64 (watch, start --follow)",
    )
    p.set_defaults(func=_cmd)
