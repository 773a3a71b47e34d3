"""One job array on a cluster, from submission to its last task's end.

`run_array` submits every task of an `ArrayPlan` as ONE array, looks at it every
`SlurmRole.poll_seconds` (one ``squeue`` for all attempts still active; the job folder's
exit records only for attempts the scheduler no longer lists), resubmits the failures worth
retrying (`states.RETRYABLE`) as one new array of just those task ids, at most
`SlurmRole.max_retries` times per task, and returns when every task is done or failed.

Every wait has a deadline. On any way out before the end (the deadline, an error, a
Ctrl-C, an `on_update` callback that raises) the tasks still queued or running are
cancelled with ``scancel`` and watched until ``squeue`` shows none of them active, so
nothing is left behind on the cluster; if that does not happen in time, the error says so.

Where the cluster keeps accounting, ``sacct`` is the word on an attempt the scheduler no
longer lists (its final state, not just its exit code), and once the array has ended it
gives every attempt's elapsed seconds and peak RSS (``accounting`` of each attempt). Where
``sacct`` does not work (no accounting storage), the job folder's exit records stand in and
the status says so (``ArrayStatus.accounting``).

The status is frozen (`ArrayStatus`): each task with its attempts (array job id, Slurm
state, nodes, reason, accounting), JSON-ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from orchestrator.errors import DflashError
from orchestrator.slurm import states
from orchestrator.slurm.answers import Accounted, TaskRecord
from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.plan import ArrayPlan
from orchestrator.slurm.role import SlurmError
from orchestrator.slurm.states import Verdict

# How long `stop` waits for scancel'ed tasks to leave the queue (Slurm's KillWait, 30 s by
# default, is how long a task may take to die after its SIGTERM).
CANCEL_TIMEOUT = 90.0


@dataclass(frozen=True)
class Attempt:
    """One submission of one task: its array job, and what the scheduler last said."""

    job_id: int
    task_id: int
    state: str = "PENDING"
    nodes: str = ""
    reason: str = ""
    accounting: dict | None = None  # sacct's record (`answers.Accounted.to_json`), if any

    @property
    def verdict(self) -> Verdict:
        return states.verdict(self.state)

    @property
    def ref(self) -> str:
        """Slurm's name for it, ``<array job id>_<task id>``."""
        return f"{self.job_id}_{self.task_id}"

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
    # Where the attempts' ends were read: {"source": "sacct"}, or the fallback and why.
    accounting: dict | None = None

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
        """The attempts still queued or running (the last of each unfinished task)."""
        return tuple(t.last for t in self.tasks if t.verdict in states.ACTIVE)

    @property
    def job_ids(self) -> tuple[int, ...]:
        """Every array job submitted for this array, in submission order."""
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
            "tasks": [t.to_json() for t in self.tasks],
        }


class ArrayRun:
    """The mutable side of one array: submits, looks, resubmits, cancels. `status` is
    its frozen picture after the last look. `retry`: the states of a failed attempt worth
    resubmitting (`states.RETRYABLE`; a caller whose tasks someone may cancel one by one
    to have them run elsewhere adds CANCELLED)."""

    def __init__(
        self, client: SlurmClient, plan: ArrayPlan, *, retry: frozenset[str] = states.RETRYABLE
    ):
        self.client = client
        self.plan = plan
        self.retry = retry
        self._tasks: dict[int, tuple[Attempt, ...]] = {}
        self._accounted = False  # sacct answered at least once

    @property
    def status(self) -> ArrayStatus:
        return ArrayStatus(
            host=self.client.name,
            name=self.plan.name,
            folder=self.plan.folder,
            tasks=tuple(TaskStatus(i, a) for i, a in sorted(self._tasks.items())),
            accounting=self._accounting_source(),
        )

    def _accounting_source(self) -> dict | None:
        off = self.client.accounting_off
        if off is not None:
            return {"source": "squeue and the job folder's exit records", "sacct": off}
        return {"source": "sacct"} if self._accounted else None

    def start(self) -> ArrayStatus:
        """Make the job folder and submit every task as one array."""
        self.client.make_folder(self.plan)
        return self.submit_all()

    def submit_all(self) -> ArrayStatus:
        """Submit every task as one array, into the job folder made already (`start`
        without its folder: the caller put the tasks' inputs there first)."""
        if self._tasks:
            raise SlurmError(f"{self.client.name}: array {self.plan.name} is started already")
        self._submit(self.plan.task_ids)
        return self.status

    def _submit(self, task_ids: Iterable[int]) -> None:
        ids = tuple(task_ids)
        job = self.client.submit(self.plan, ids)
        for i in ids:
            self._tasks[i] = (*self._tasks.get(i, ()), Attempt(job, i))

    def poll(self, *, resubmit: bool = True) -> ArrayStatus:
        """Look once: update every active attempt, then (with `resubmit`) submit the
        tasks that failed in a way worth retrying, and have retries left, as one array."""
        active = self.status.active
        asked: dict[int, set[int]] = {}
        for a in active:
            asked.setdefault(a.job_id, set()).add(a.task_id)
        # A job's tasks are validated against all of its tasks: one that ended is still
        # listed (for MinJobAge) and is an answer about a task dflash did submit.
        submitted: dict[int, set[int]] = {}
        for i, attempts in self._tasks.items():
            for a in attempts:
                if a.job_id in asked:
                    submitted.setdefault(a.job_id, set()).add(i)
        records = self.client.queue({j: frozenset(t) for j, t in submitted.items()})
        gone = [a for a in active if (a.job_id, a.task_id) not in records]
        ended = self._ended_by_sacct(gone, submitted)
        rest = [(a.job_id, a.task_id) for a in gone if (a.job_id, a.task_id) not in ended]
        codes = self.client.exit_codes(self.plan, rest)
        for a in active:
            key = (a.job_id, a.task_id)
            if key in ended:
                self._replace(a, _accounted(a, ended[key]))
            else:
                self._replace(a, _updated(a, records.get(key), codes.get(key)))
        if resubmit:
            retry = [
                t.task_id
                for t in self.status.tasks
                if t.verdict == "failed"
                and t.last.state in self.retry
                and len(t.attempts) <= self.plan.role.max_retries
            ]
            if retry:
                self._submit(retry)
        return self.status

    def _ended_by_sacct(
        self, gone: list[Attempt], submitted: dict[int, set[int]]
    ) -> dict[tuple[int, int], Accounted]:
        """sacct's records of the attempts squeue no longer lists that have ended (none
        where the cluster keeps no accounting)."""
        if not gone:
            return {}
        jobs = {a.job_id for a in gone}
        found = self.client.accounting({j: frozenset(submitted[j]) for j in jobs})
        if found is None:
            return {}
        self._accounted = True
        keys = {(a.job_id, a.task_id) for a in gone}
        return {
            k: r
            for k, r in found.items()
            if k in keys and states.verdict(r.state) not in states.ACTIVE
        }

    def account(self) -> ArrayStatus:
        """Every attempt's accounting record from sacct (elapsed seconds, peak RSS, exit
        code), where the cluster has one; the status either way."""
        asked: dict[int, set[int]] = {}
        for i, attempts in self._tasks.items():
            for a in attempts:
                asked.setdefault(a.job_id, set()).add(i)
        found = self.client.accounting({j: frozenset(t) for j, t in asked.items()})
        if found is not None:
            self._accounted = True
            for i, attempts in self._tasks.items():
                self._tasks[i] = tuple(
                    replace(a, accounting=found[(a.job_id, i)].to_json())
                    if (a.job_id, i) in found
                    else a
                    for a in attempts
                )
        return self.status

    def _replace(self, old: Attempt, new: Attempt) -> None:
        attempts = self._tasks[old.task_id]
        self._tasks[old.task_id] = (*attempts[:-1], new)

    def cancel(self, task_ids: Iterable[int] | None = None) -> str:
        """``scancel`` the active attempts of `task_ids` (all tasks when None); their
        verdicts change when a look sees it. Returns scancel's complaint, if any."""
        wanted = None if task_ids is None else set(task_ids)
        refs = [a.ref for a in self.status.active if wanted is None or a.task_id in wanted]
        return self.client.cancel(refs)

    def stop(self, timeout: float = CANCEL_TIMEOUT) -> ArrayStatus:
        """Cancel every active attempt and look until none is queued or running;
        `SlurmError` if some still are after `timeout` seconds."""
        if not self.status.active:
            return self.status
        complaint = self.cancel()
        deadline = time.monotonic() + timeout
        while True:
            status = self.poll(resubmit=False)
            if not status.active:
                return status
            if time.monotonic() >= deadline:
                left = ", ".join(a.describe() for a in status.active)
                said = f"; scancel said: {complaint}" if complaint else ""
                raise SlurmError(
                    f"{self.client.name}: still queued or running {timeout:g}s after scancel: "
                    f"{left}{said}"
                )
            time.sleep(min(1.0, self.plan.role.poll_seconds, max(0.0, deadline - time.monotonic())))

    def wait(
        self,
        timeout: float,
        on_update: Callable[[ArrayStatus], None] | None = None,
    ) -> ArrayStatus:
        """Look every `poll_seconds` until every task is done or failed, calling
        `on_update` with each new status. Past `timeout` seconds, or on any error, the
        array is stopped (`stop`) and the error raised."""
        try:
            return self._wait(timeout, on_update)
        except BaseException as exc:
            self._stop_after(exc)
            raise

    def _wait(self, timeout: float, on_update) -> ArrayStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.poll()
            if on_update is not None:
                on_update(status)
            if status.finished:
                return self.account()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                left = ", ".join(f"task {a.task_id} {a.describe()}" for a in status.active)
                raise SlurmError(
                    f"{self.client.name}: array {self.plan.name} did not finish within "
                    f"{timeout:g}s ({left}); its tasks are cancelled"
                )
            time.sleep(min(self.plan.role.poll_seconds, remaining))

    def _stop_after(self, exc: BaseException) -> None:
        try:
            self.stop()
        except DflashError as stop_exc:
            raise SlurmError(f"{exc}; and stopping the array failed: {stop_exc}") from exc


def _accounted(attempt: Attempt, record: Accounted) -> Attempt:
    """The attempt as sacct says it ended (squeue no longer lists it)."""
    return replace(
        attempt,
        state=record.state,
        reason=f"exit {record.exit_code}:{record.signal} by sacct; squeue no longer lists it",
        accounting=record.to_json(),
    )


def _updated(attempt: Attempt, record: TaskRecord | None, code: int | None) -> Attempt:
    """The attempt after one look: as squeue lists it; else as the job folder's exit record
    says it ended; else lost (listed nowhere, and it never recorded an end)."""
    if record is not None:
        return replace(
            attempt,
            state=record.state,
            nodes=record.nodes or attempt.nodes,
            reason=record.reason,
        )
    if code is not None:
        return replace(
            attempt,
            state="COMPLETED" if code == 0 else "FAILED",
            reason=f"exit {code} by the job folder's record; squeue no longer lists it",
        )
    return replace(
        attempt,
        state=states.LOST,
        reason="squeue no longer lists it and it left no exit record",
    )


def run_array(
    client: SlurmClient,
    plan: ArrayPlan,
    *,
    timeout: float,
    on_update: Callable[[ArrayStatus], None] | None = None,
) -> ArrayStatus:
    """Submit `plan` as one array on `client`'s login node and watch it to the end
    (`ArrayRun.wait`): the final status, failed tasks included (`ArrayStatus.failed`,
    `ArrayStatus.failure_line`). Nothing is left queued on any way out."""
    run = ArrayRun(client, plan)
    run.start()
    return run.wait(timeout, on_update)
