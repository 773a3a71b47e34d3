"""``job start``: the job's folder, its carried input files, its detached runner; a bad
spec or a failed preflight leaves no job behind."""

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
    """Create the job folder, spawn the detached runner, return {job_id, dir, pid, pgid};
    with `preflight`, wait for the runner's host checks (sharing its torch import)."""
    path = job_dir(workdir, job_id)
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
    except OSError as exc:
        raise UserError(f"cannot start the job: {write_error(exc, path.parent)}") from None
    try:
        return _spawn(path, workdir, job_id, spec, threads, nice, preflight)
    except OSError as exc:  # nothing is left started
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
    """`start`'s second half, in the new folder `path`: its files, its runner."""
    reserve_exit(path)
    spec = dict(spec, job_id=job_id, workdir=str(Path(os.path.expanduser(workdir))))
    prompts = spec.get("prompts")
    if isinstance(prompts, dict) and isinstance(prompts.get("path"), str):
        # the controller writes ``~/...`` (no home lookup); the job records the real path
        spec["prompts"] = dict(prompts, path=os.path.expanduser(prompts["path"]))
    write_json_atomic(path / "spec.json", spec)
    log = open(path / "log.txt", "ab")
    env = source_env()
    if threads:
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
    for _ in range(100):
        starttime = proc_starttime(proc.pid)
        if starttime is not None or proc.poll() is not None:
            break
        time.sleep(0.01)
    info = {"pid": proc.pid, "pgid": proc.pid, "starttime": starttime, "started": time.time()}
    info["nice"] = os.getpriority(os.PRIO_PROCESS, proc.pid)  # unreaped, so still there
    try:
        write_json_atomic(path / "pid.json", info)
    except OSError:  # a runner nobody could find again is not left running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if preflight:
        info["preflight"] = _preflight_outcome(path, proc)
        return {"job_id": job_id, "dir": str(path), **info}
    # a runner that died already (bad python, import error) is said now
    time.sleep(0.05)
    if proc.poll() not in (None, 0) and not (path / "exit.json").exists():
        tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
        raise UserError(
            f"job runner exited at once with code {proc.returncode}: "
            f"{tail[0] if tail else 'no output'}"
        )
    return {"job_id": job_id, "dir": str(path), **info}


def write_carried(workdir: str, carried: list) -> list[Path]:
    """Write the input files a job start carries where none is yet, after checking each:
    a plain name in one of `CARRY_DIRS`, its size and sha256; never through a link."""
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
        if not target.is_file() or target.is_symlink():  # content-addressed
            write_atomic(target, data)
    return [t for t, _ in checked]


# under the controller's limit on `job start`
PREFLIGHT_WAIT_SECONDS = 110.0


def _preflight_outcome(path: Path, proc: subprocess.Popen) -> dict:
    """The runner's ``preflight.json`` once written; a failure is one line, the runner
    ended and its folder gone."""
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
    elif isinstance(ended, dict) and ended.get("error"):
        error = str(ended["error"])
        if ended.get("log"):  # the job stays for people to read its log
            raise UserError(f"during its host checks, {error}")
    else:
        tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
        error = (
            f"job runner exited with code {proc.returncode} during its host checks: "
            f"{tail[0] if tail else 'no output'}"
        )
    shutil.rmtree(path, ignore_errors=True)
    raise UserError(error)
