"""``job array-end``: the controller's word on how the scheduler ended one attempt of a
Slurm array task, written into the attempt's job folder.

The job itself cannot tell: a node failure, a time limit or a preemption reaches it as the
SIGTERM a ``scancel`` sends (it records ``cancelled by request``), and a SIGKILL, an
out-of-memory kill or a dead node leave no record at all. The controller knows from the
scheduler and says it here, so ``job status`` on the login node (and whoever reads the
folder) sees a node failure as a node failure. Standard library only: it runs on the
login node.
"""

from __future__ import annotations

import time

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.jobs.folder import existing_job_dir, job_state, read_json, write_exit
from remote.protocol import JobState, SpecError, check_slurm_end


def record_end(workdir: str, job_id: str, end: object) -> dict:
    """The scheduler's end of attempt `job_id` (`remote.protocol.check_slurm_end`) into its
    job folder: always as ``slurm.json``; as ``exit.json`` too (state ``failed``, the
    scheduler's why as its error, the job's own record kept under ``runner``) where the job
    recorded no end, or recorded the cancellation that a scheduler's signal other than
    ``scancel`` looks like. The job's state afterwards (`job_state`)."""
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
        (path / "exit.json").unlink(missing_ok=True)  # write_exit: the reserve, or a new file
        write_exit(path, info)
    return job_state(path)
