"""``job cancel``: stop a job and every process of its group, and record it cancelled."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from remote.errors import UserError
from remote.jobs.folder import group_members, job_state, read_json, runner_alive, write_exit
from remote.protocol import TERMINAL_STATES, JobState

CANCEL_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0  # only a process stuck in the kernel outlives a SIGKILL


def cancel(path: Path) -> dict:
    """Stop the job's whole process group (TERM, a grace, KILL); one line if a process
    outlives that."""
    state = job_state(path)
    pid_info = read_json(path / "pid.json")
    if not pid_info or (state["state"] in TERMINAL_STATES and not group_members(pid_info["pgid"])):
        # a job still "starting" has no runner yet: it is marked, not killed
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
        "state": JobState.CANCELLED,
        "code": -signal.SIGKILL,
        "error": "cancelled by request",
        "finished": time.time(),
    }
