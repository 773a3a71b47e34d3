"""``job array``: one Slurm array task's job, in the foreground, Slurm its supervisor; an
ordinary job folder, a fresh one per attempt (docs/slurm.md, "An eval as one array")."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.eval.job import job_engine
from remote.jobs.folder import job_dir, job_kind, proc_starttime, read_json, reserve_exit
from remote.jobs.supervise import supervise

_ID = re.compile(r"0|[1-9][0-9]{0,9}")


def _slurm_id(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not _ID.fullmatch(value):
        raise UserError(f"job array: {name} is {value!r}, not a number; run it under sbatch")
    return value


def task_job_id(prefix: str, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(task id, job id) of this attempt: ``<prefix>-<task>-<array job>``."""
    task = _slurm_id(environ, "SLURM_ARRAY_TASK_ID")
    job = _slurm_id(environ, "SLURM_ARRAY_JOB_ID")
    return task, f"{prefix}-{task}-{job}"


def run_task(workdir: str, prefix: str, specs: str, environ: Mapping[str, str] = os.environ) -> int:
    """Make this attempt's job folder from its task's spec, run the job; its exit code."""
    task, job_id = task_job_id(prefix, environ)
    path = job_dir(workdir, job_id)
    spec = read_json(Path(specs) / f"{task}.json")
    if not isinstance(spec, dict):
        raise UserError(f"job array: {specs}/{task}.json is missing or not a JSON object")
    job_kind(spec)
    threads = job_engine(spec).threads if "eval" in spec else None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        raise UserError(f"job array: job folder {path} exists already") from None
    reserve_exit(path)
    spec = dict(spec, job_id=job_id, workdir=str(Path(os.path.expanduser(workdir))))
    write_json_atomic(path / "spec.json", spec)
    pid = os.getpid()
    write_json_atomic(
        path / "pid.json",
        {
            "pid": pid,
            "pgid": os.getpgid(0),
            "starttime": proc_starttime(pid),
            "started": time.time(),
        },
    )
    if threads:  # before torch is imported, as `job start` does
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    return supervise(path, preflight=True)
