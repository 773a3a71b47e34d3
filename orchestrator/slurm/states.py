"""Slurm's job states and what each means for one array task (docs/slurm.md)."""

from __future__ import annotations

from typing import Literal

Verdict = Literal["queued", "running", "done", "failed"]

# ours, not Slurm's: neither the scheduler nor the job folder knows the task any more
LOST = "LOST"

VERDICTS: dict[str, Verdict] = {
    "PENDING": "queued",
    "CONFIGURING": "queued",
    "POWER_UP_NODE": "queued",
    "REQUEUED": "queued",
    "REQUEUE_FED": "queued",
    "REQUEUE_HOLD": "queued",
    "RESV_DEL_HOLD": "queued",
    "SPECIAL_EXIT": "queued",
    "RUNNING": "running",
    "COMPLETING": "running",
    "RESIZING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "STOPPED": "running",
    "SUSPENDED": "running",
    "COMPLETED": "done",
    "BOOT_FAIL": "failed",
    "CANCELLED": "failed",
    "DEADLINE": "failed",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "PREEMPTED": "failed",
    "REVOKED": "failed",
    "TIMEOUT": "failed",
    LOST: "failed",
}

# a second attempt can pass without anyone changing anything
RETRYABLE = frozenset({"BOOT_FAIL", "FAILED", "NODE_FAIL", "PREEMPTED", LOST})

ACTIVE: frozenset[Verdict] = frozenset({"queued", "running"})


def verdict(state: str) -> Verdict:
    """What a (known) state means for the task: queued, running, done or failed."""
    return VERDICTS[state]


def is_known(state: str) -> bool:
    return state in VERDICTS
