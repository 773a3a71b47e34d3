"""Where one job array stands, frozen and JSON-ready; `Attempt.why` is the one wording of
why an attempt failed."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from orchestrator.slurm import states
from orchestrator.slurm.answers import Accounted, TaskRecord
from orchestrator.slurm.states import Verdict

_WHY = {
    "BOOT_FAIL": "its node failed to boot",
    "CANCELLED": "cancelled on the cluster (scancel)",
    "DEADLINE": "its deadline passed",
    "OUT_OF_MEMORY": "out of memory",
    "PREEMPTED": "preempted",
    "REVOKED": "revoked",
    "TIMEOUT": "time limit reached",
}


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 70`` for a number without a name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Attempt:
    """One submission of one task: its array job, and what the scheduler last said."""

    job_id: int
    task_id: int
    state: str = "PENDING"
    nodes: str = ""
    reason: str = ""
    accounting: dict | None = None
    exit_code: int | None = None

    @property
    def verdict(self) -> Verdict:
        return states.verdict(self.state)

    @property
    def ref(self) -> str:
        """Slurm's name for it, ``<array job id>_<task id>``."""
        return f"{self.job_id}_{self.task_id}"

    @property
    def why(self) -> str:
        """Why it failed, in a few words ("" unless it failed)."""
        if self.verdict != "failed":
            return ""
        if self.state == "NODE_FAIL":
            return f"node failure on {self.nodes}" if self.nodes else "node failure"
        if self.state == states.LOST:
            return "lost: " + self.reason
        if self.state == "FAILED":
            sig = (self.accounting or {}).get("signal") or 0
            if not sig and self.exit_code is not None and self.exit_code > 128:
                sig = self.exit_code - 128  # the shell's code for a signalled child
            if sig:
                return f"killed by signal {sig} ({signal_name(sig)})"
            return f"exit code {self.exit_code}" if self.exit_code is not None else "failed"
        return _WHY.get(self.state, self.state.lower())

    def describe(self) -> str:
        where = f" on {self.nodes}" if self.nodes else ""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"{self.ref} {self.state}{where}{why}"

    def to_json(self) -> dict:
        out = {
            "job": self.ref,
            "state": self.state,
            "verdict": self.verdict,
            "nodes": self.nodes,
            "reason": self.reason,
        }
        if self.verdict == "failed":
            out["why"] = self.why
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.accounting is not None:
            out["accounting"] = self.accounting
        return out


@dataclass(frozen=True)
class TaskStatus:
    """One array task: its attempts, oldest first; the last one is the task's verdict."""

    task_id: int
    attempts: tuple[Attempt, ...]

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]

    @property
    def verdict(self) -> Verdict:
        return self.last.verdict

    def to_json(self) -> dict:
        return {
            "task": self.task_id,
            "verdict": self.verdict,
            "attempts": [a.to_json() for a in self.attempts],
        }


@dataclass(frozen=True)
class ArrayStatus:
    """Where every task of one array stands."""

    host: str
    name: str
    folder: str
    tasks: tuple[TaskStatus, ...]
    accounting: dict | None = None
    notes: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return all(t.verdict not in states.ACTIVE for t in self.tasks)

    @property
    def done(self) -> tuple[int, ...]:
        return tuple(t.task_id for t in self.tasks if t.verdict == "done")

    @property
    def failed(self) -> tuple[int, ...]:
        return tuple(t.task_id for t in self.tasks if t.verdict == "failed")

    @property
    def active(self) -> tuple[Attempt, ...]:
        """The attempts still queued or running."""
        return tuple(t.last for t in self.tasks if t.verdict in states.ACTIVE)

    @property
    def job_ids(self) -> tuple[int, ...]:
        """Every array job submitted for this array."""
        return tuple(sorted({a.job_id for t in self.tasks for a in t.attempts}))

    def failure_line(self) -> str:
        """One line naming each failed task's last attempt; "" when none failed."""
        failed = [t for t in self.tasks if t.verdict == "failed"]
        if not failed:
            return ""
        return (
            f"{self.host}: {len(failed)} of {len(self.tasks)} tasks of array {self.name} "
            f"failed: "
            + "; ".join(
                f"task {t.task_id} {t.last.describe()} after {len(t.attempts)} attempt"
                f"{'s' if len(t.attempts) > 1 else ''}"
                for t in failed
            )
        )

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "name": self.name,
            "folder": self.folder,
            "jobs": list(self.job_ids),
            "done": list(self.done),
            "failed": list(self.failed),
            "accounting": self.accounting,
            "notes": list(self.notes),
            "tasks": [t.to_json() for t in self.tasks],
        }


def accounted(attempt: Attempt, record: Accounted) -> Attempt:
    """The attempt as sacct says it ended (squeue no longer lists it)."""
    return replace(
        attempt,
        state=record.state,
        reason=f"exit {record.exit_code}:{record.signal} by sacct; squeue no longer lists it",
        accounting=record.to_json(),
    )


def updated(attempt: Attempt, record: TaskRecord | None, code: int | None) -> Attempt:
    """The attempt after one look: as squeue lists it, else as its exit record says,
    else lost."""
    if record is not None:
        ended = states.verdict(record.state) not in states.ACTIVE
        return replace(
            attempt,
            state=record.state,
            nodes=record.nodes or attempt.nodes,
            reason=record.reason,
            exit_code=code if ended and code is not None else attempt.exit_code,
        )
    if code is not None:
        return replace(
            attempt,
            state="COMPLETED" if code == 0 else "FAILED",
            reason=f"exit {code} by the job folder's record; squeue no longer lists it",
            exit_code=code,
        )
    return replace(
        attempt,
        state=states.LOST,
        reason="squeue no longer lists it and it left no exit record",
    )


def recorded_end(attempt: Attempt, code: int, grace: float) -> Attempt:
    """The attempt as its exit record says it ended, squeue still listing it running."""
    return replace(
        attempt,
        state="COMPLETED" if code == 0 else "FAILED",
        reason=(
            f"exit {code} by the job folder's record; squeue still listed it "
            f"{attempt.state} {grace:g}s later"
        ),
        exit_code=code,
    )
