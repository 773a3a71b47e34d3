"""Slurm's job states (``squeue -o %T``) and what each means for one array task here.

A task is queued, running, done or failed. Every state Slurm prints (its
``job_state_string``: the base states and the flag states it shows instead of them) is
listed, so an answer outside this vocabulary is refused rather than guessed at.

Failures split by whether a second attempt can succeed without anyone changing anything:
a lost node, a preemption or a crashed process can; a limit that was hit (time, memory,
deadline) or a cancellation someone chose will fail, or be cancelled, the same way again.
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["queued", "running", "done", "failed"]

# Ours, not Slurm's: neither the scheduler nor the job folder knows the task any more.
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
    "COMPLETING": "running",  # the end is not known until the epilog is through
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

# Failures worth resubmitting: the same task can succeed on another node or a second try.
RETRYABLE = frozenset({"BOOT_FAIL", "FAILED", "NODE_FAIL", "PREEMPTED", LOST})

ACTIVE: frozenset[Verdict] = frozenset({"queued", "running"})


def verdict(state: str) -> Verdict:
    """What a (known) state means for the task: queued, running, done or failed."""
    return VERDICTS[state]


def is_known(state: str) -> bool:
    return state in VERDICTS
