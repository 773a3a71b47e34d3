"""``job array-end``: how the scheduler ended a Slurm task's attempt, which the job cannot
tell, written into its folder (docs/slurm.md); stdlib only, for the login node."""

from __future__ import annotations

import time

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.jobs.folder import existing_job_dir, job_state, read_json, write_exit
from remote.protocol import JobState, SpecError, check_slurm_end


def record_end(workdir: str, job_id: str, end: object) -> dict:
    """The scheduler's end of attempt `job_id` as ``slurm.json``, and as a failed
    ``exit.json`` where the job's own says nothing or a mistaken cancel; its state."""
    try:
        end = check_slurm_end(end)
    except SpecError as exc:
        raise UserError(f"job array-end: {exc}") from None
    path = existing_job_dir(workdir, job_id)
    write_json_atomic(path / "slurm.json", {**end, "recorded": time.time()})
    own = read_json(path / "exit.json")
    own_state = own.get("state") if isinstance(own, dict) else None
    if own_state is None or (own_state == JobState.CANCELLED and end["state"] != "CANCELLED"):
        code = end.get("exit_code")
        if code is None and isinstance(own, dict):
            code = own.get("code")
        info = {
            "state": JobState.FAILED,
            "code": code,
            "error": f"{end['why']} (Slurm: {end['job']} {end['state']})",
            "finished": time.time(),
            "runner": own,
        }
        (path / "exit.json").unlink(missing_ok=True)
        write_exit(path, info)
    return job_state(path)
