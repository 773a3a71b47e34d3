"""``job start``: the job's folder, its carried input files, its detached runner.

`start` refuses a bad spec before anything exists, writes the files the start carries,
makes the folder (with room kept for its exit record), and spawns ``job run`` in a new
session; with ``--preflight`` it waits for the runner's host checks and, when they fail,
leaves no job behind.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from remote.atomic import write_atomic, write_json_atomic
from remote.entry import self_command, source_env
from remote.errors import UserError
from remote.eval.job import job_engine
from remote.jobs.folder import (
    job_dir,
    job_kind,
    proc_starttime,
    read_json,
    reserve_exit,
    write_error,
)
from remote.protocol import (
    CARRY_DIRS,
    CARRY_MAX_BYTES,
    JOB_CARRY_KEY,
    JobSpec,
    SpecError,
    carried_name_problem,
)


def start(workdir: str, job_id: str, spec: dict, preflight: bool = False) -> dict:
    """Create the job folder, spawn the detached runner, return {job_id, dir, pid, pgid}.

    With `preflight`, the runner first runs the host-side checks (`remote.eval.preflight.check`)
    and this call waits for their outcome: a failure is raised as its one line and the job
    folder is removed (no job was started), a success is in the answer (``preflight``). The
    checks then share the runner's python and torch import instead of paying for their own.
    """
    path = job_dir(workdir, job_id)
    # a bad kind or engine spec is refused here, before a folder or a process exists
    job_kind(spec)
    threads = job_engine(spec).threads if "eval" in spec else None
    try:
        nice = JobSpec.setting_in(spec, "nice")
    except SpecError as exc:
        raise UserError(f"job spec: {exc}") from None
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
        return _spawn(path, workdir, job_id, spec, threads, nice, preflight)
    except OSError as exc:  # no room for the job's first files: nothing is left started
        shutil.rmtree(path, ignore_errors=True)
        raise UserError(f"cannot start the job: {write_error(exc, path)}") from None


def _spawn(
    path: Path,
    workdir: str,
    job_id: str,
    spec: dict,
    threads: int | None,
    nice: int,
    preflight: bool,
) -> dict:
    """`start`'s second half, in the job's new folder `path`: its files, its runner (with
    `nice` added to its niceness)."""
    reserve_exit(path)
    spec = dict(spec, job_id=job_id, workdir=str(Path(os.path.expanduser(workdir))))
    prompts = spec.get("prompts")
    if isinstance(prompts, dict) and isinstance(prompts.get("path"), str):
        # The controller names a carried file under the workdir as its inventory does
        # (``~/.dflash/...``: no home lookup there); the job records the real path.
        spec["prompts"] = dict(prompts, path=os.path.expanduser(prompts["path"]))
    write_json_atomic(path / "spec.json", spec)
    log = open(path / "log.txt", "ab")
    env = source_env()
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
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    log.close()
    starttime = None
    for _ in range(100):  # /proc entry appears with the fork; a few ms at most
        starttime = proc_starttime(proc.pid)
        if starttime is not None or proc.poll() is not None:
            break
        time.sleep(0.01)
    info = {"pid": proc.pid, "pgid": proc.pid, "starttime": starttime, "started": time.time()}
    info["nice"] = os.getpriority(os.PRIO_PROCESS, proc.pid)  # unreaped: there until waited
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
    ended = read_json(path / "exit.json") or {}
    if timed_out:
        error = (
            f"the host checks (python, torch import, the target's config) took more than "
            f"{PREFLIGHT_WAIT_SECONDS:g}s; is the host overloaded? Nothing was started"
        )
    elif isinstance(outcome, dict) and outcome.get("error"):
        error = str(outcome["error"])
    elif isinstance(ended, dict) and ended.get("error"):  # a full disk, a killed runner
        error = str(ended["error"])
        if ended.get("log"):  # its record names the log: the job stays for people to read
            raise UserError(f"during its host checks, {error}")
    else:
        tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
        error = (
            f"job runner exited with code {proc.returncode} during its host checks: "
            f"{tail[0] if tail else 'no output'}"
        )
    shutil.rmtree(path, ignore_errors=True)  # nothing was started: leave no job behind
    raise UserError(error)
