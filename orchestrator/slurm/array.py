"""One job array on a cluster, from submission to its last task's end.

`run_array` submits every task of an `ArrayPlan` as ONE array, looks at it every
`SlurmRole.poll_seconds` (one ``squeue`` for all attempts still active; the job folder's
exit records for attempts the scheduler no longer lists or lists as failed), resubmits the
failures worth retrying (`states.RETRYABLE`) as one new array of just those task ids, at
most `SlurmRole.max_retries` times per task, and returns when every task is done or failed.

Every wait has a deadline. On any way out before the end (the deadline, an error, a
Ctrl-C, an `on_update` callback that raises) the tasks still queued or running are
cancelled with ``scancel`` and watched until ``squeue`` shows none of them active, so
nothing is left behind on the cluster; if that does not happen in time, or ``scancel``
does not answer, the error says so and names the array jobs to cancel by hand. Two
answers are not waited on for ever either: an attempt ``squeue`` keeps listing as running
`EXIT_GRACE` seconds after the job folder recorded its end is taken as the record says
and cancelled; one ``squeue`` no longer lists that recorded no end is LOST, and cancelled
in case it still runs. Each is said in the status (its reason, `ArrayStatus.notes`).

Where the cluster keeps accounting, ``sacct`` is the word on an attempt the scheduler no
longer lists (its final state, not just its exit code), and once the array has ended it
gives every attempt's elapsed seconds and peak RSS (``accounting`` of each attempt). Where
``sacct`` does not work (no accounting storage) or answers what cannot be read, the job
folder's exit records stand in and the status says so (``ArrayStatus.accounting``).

The status is frozen (`orchestrator.slurm.status.ArrayStatus`): each task with its
attempts, JSON-ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from orchestrator.errors import DflashError
from orchestrator.slurm import states
from orchestrator.slurm.answers import Accounted, TaskRecord
from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.plan import ArrayPlan
from orchestrator.slurm.role import SlurmError
from orchestrator.slurm.status import ArrayStatus as ArrayStatus
from orchestrator.slurm.status import Attempt, TaskStatus, accounted, recorded_end, updated

# How long `stop` waits for scancel'ed tasks to leave the queue (Slurm's KillWait, 30 s by
# default, is how long a task may take to die after its SIGTERM).
CANCEL_TIMEOUT = 90.0
# On the way out each login-node command gets this long (not the usual 60 s): a hung
# scancel must not hold a Ctrl-C or a SIGTERM for a minute.
STOP_COMMAND_TIMEOUT = 15.0
# How long squeue may go on listing as running an attempt whose end the job folder
# recorded (its epilog, a slow controller) before the record is trusted.
EXIT_GRACE = 30.0


class ArrayRun:
    """The mutable side of one array: submits, looks, resubmits, cancels. `status` is
    its frozen picture after the last look. `retry`: the states of a failed attempt worth
    resubmitting (`states.RETRYABLE`; a caller whose tasks someone may cancel one by one
    to have them run elsewhere adds CANCELLED). `exit_grace`: how long squeue may list
    as running an attempt whose end the job folder recorded (None: `EXIT_GRACE`)."""

    def __init__(
        self,
        client: SlurmClient,
        plan: ArrayPlan,
        *,
        retry: frozenset[str] = states.RETRYABLE,
        exit_grace: float | None = None,
    ):
        self.client = client
        self.plan = plan
        self.retry = retry
        self.exit_grace = EXIT_GRACE if exit_grace is None else exit_grace
        self._tasks: dict[int, tuple[Attempt, ...]] = {}
        self._accounted = False  # sacct answered at least once
        self._notes: list[str] = []
        # (job, task) -> when its exit record was first seen while squeue listed it running
        self._recorded: dict[tuple[int, int], float] = {}
        self._next_record_look = 0.0  # when the running attempts' exit records are read next

    @property
    def status(self) -> ArrayStatus:
        return ArrayStatus(
            host=self.client.name,
            name=self.plan.name,
            folder=self.plan.folder,
            tasks=tuple(TaskStatus(i, a) for i, a in sorted(self._tasks.items())),
            accounting=self._accounting_source(),
            notes=tuple(self._notes),
        )

    def note(self, line: str) -> None:
        """Say `line` (one line) in the status: a fallback or a decision taken on the way."""
        self._notes.append(line)

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
        now = time.monotonic()
        codes = self.client.exit_codes(self.plan, self._records_to_read(active, records, ended))
        stale, lost = [], []
        for a in active:
            key = (a.job_id, a.task_id)
            if key in ended:
                new = accounted(a, ended[key])
            else:
                new = updated(a, records.get(key), codes.get(key))
                if new.verdict == "running" and key in codes:
                    # squeue says running, the job folder says it ended: trust the
                    # record once squeue has had its grace
                    since = self._recorded.setdefault(key, now)
                    if now - since >= self.exit_grace:
                        new = recorded_end(new, codes[key], self.exit_grace)
                        stale.append(new)
                elif new.state == states.LOST:
                    lost.append(new)
            self._replace(a, new)
        self._cancel_ended(stale, lost)
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

    def _records_to_read(
        self, active: Iterable[Attempt], records: dict[tuple[int, int], TaskRecord], ended
    ) -> list[tuple[int, int]]:
        """The attempts whose exit records this look reads: those squeue no longer lists
        (and sacct did not settle) or lists as failed (the code says how: a signal, an
        exit code), and, every half grace, those it lists as running."""
        now = time.monotonic()
        running = now >= self._next_record_look
        if running:
            self._next_record_look = now + self.exit_grace / 2
        keys = []
        for a in active:
            key = (a.job_id, a.task_id)
            record = records.get(key)
            verdict = states.verdict(record.state) if record else None
            if key not in ended and (
                verdict in (None, "failed") or (running and verdict == "running")
            ):
                keys.append(key)
        return keys

    def _cancel_ended(self, stale: list[Attempt], lost: list[Attempt]) -> None:
        """``scancel`` what squeue may still run: the attempts it listed as running long
        after their recorded end (said in a note), and the lost ones (said in their
        reason)."""
        if stale:
            refs = [a.ref for a in stale]
            said = self.client.cancel(refs)
            one = len(refs) == 1
            self.note(
                f"{self.client.name}: squeue still listed {', '.join(refs)} as running "
                f"{self.exit_grace:g}s after the job folder recorded {'its' if one else 'their'} "
                f"end; trusted the record and cancelled {'it' if one else 'them'}"
                + (f" (scancel said: {said})" if said else "")
            )
        if lost:
            said = self.client.cancel([a.ref for a in lost])
            for a in lost:
                more = f"; scancel said: {said}" if said else ""
                why = f"{a.reason}; cancelled in case it still runs{more}"
                self._replace(a, replace(a, reason=why))

    def _ended_by_sacct(
        self, gone: list[Attempt], submitted: dict[int, set[int]]
    ) -> dict[tuple[int, int], Accounted]:
        """sacct's records of the attempts squeue no longer lists that have ended (none
        where the cluster keeps no accounting)."""
        if not gone:
            return {}
        jobs = {a.job_id for a in gone}
        found = self._sacct({j: frozenset(submitted[j]) for j in jobs})
        if found is None:
            return {}
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
        found = self._sacct({j: frozenset(t) for j, t in asked.items()})
        if found is not None:
            for i, attempts in self._tasks.items():
                self._tasks[i] = tuple(
                    replace(a, accounting=found[(a.job_id, i)].to_json())
                    if (a.job_id, i) in found
                    else a
                    for a in attempts
                )
        return self.status

    def _sacct(self, asked: dict[int, frozenset[int]]) -> dict[tuple[int, int], Accounted] | None:
        """`SlurmClient.accounting`, with a note the first time its answer was unreadable
        (where the cluster has no accounting storage its refusal is no news)."""
        before = self.client.accounting_off
        found = self.client.accounting(asked)
        if found is not None:
            self._accounted = True
        elif before is None and self.client.accounting_unreadable:
            self.note(
                f"{self.client.accounting_off}; the tasks' ends are read from squeue and the "
                "job folder's exit records"
            )
        return found

    def _replace(self, old: Attempt, new: Attempt) -> None:
        attempts = self._tasks[old.task_id]
        self._tasks[old.task_id] = (*attempts[:-1], new)

    def cancel(self, task_ids: Iterable[int] | None = None, timeout: float | None = None) -> str:
        """``scancel`` the active attempts of `task_ids` (all tasks when None); their
        verdicts change when a look sees it. Returns scancel's complaint, if any."""
        wanted = None if task_ids is None else set(task_ids)
        refs = [a.ref for a in self.status.active if wanted is None or a.task_id in wanted]
        return self.client.cancel(refs, timeout=timeout)

    def stop(self, timeout: float = CANCEL_TIMEOUT) -> ArrayStatus:
        """Cancel every active attempt and look until none is queued or running, each
        command bounded by `STOP_COMMAND_TIMEOUT`; `SlurmError` naming the array jobs to
        cancel by hand if scancel does not answer or some are still active after
        `timeout` seconds."""
        if not self.status.active:
            return self.status
        usual, self.client.timeout = (
            self.client.timeout,
            min(self.client.timeout, STOP_COMMAND_TIMEOUT),
        )
        try:
            return self._stop(timeout)
        finally:
            self.client.timeout = usual

    def _stop(self, timeout: float) -> ArrayStatus:
        try:
            complaint = self.cancel()
        except DflashError as exc:
            raise SlurmError(self._by_hand(f"scancel did not answer: {exc}")) from None
        deadline = time.monotonic() + timeout
        while True:
            status = self.poll(resubmit=False)
            if not status.active:
                return status
            if time.monotonic() >= deadline:
                left = ", ".join(a.describe() for a in status.active)
                said = f"; scancel said: {complaint}" if complaint else ""
                what = f"still queued or running {timeout:g}s after scancel: {left}{said}"
                raise SlurmError(self._by_hand(what))
            time.sleep(min(1.0, self.plan.role.poll_seconds, max(0.0, deadline - time.monotonic())))

    def _by_hand(self, what: str) -> str:
        """One line: array `name` may still hold the cluster (`what`), and the scancel
        that ends it, for a person to run on the login node."""
        jobs = " ".join(str(j) for j in sorted({a.job_id for a in self.status.active}))
        return (
            f"{self.client.name}: array {self.plan.name} may still be queued or running "
            f"({what}); cancel it by hand on {self.client.name}: scancel {jobs}"
        )

    def wait(
        self,
        timeout: float,
        on_update: Callable[[ArrayStatus], None] | None = None,
    ) -> ArrayStatus:
        """Look every `poll_seconds` until every task is done or failed, calling
        `on_update` with each new status (and the final one where the accounting added a
        note). Past `timeout` seconds, or on any error, the array is stopped (`stop`) and
        the error raised."""
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
                final = self.account()
                if on_update is not None and final.notes != status.notes:
                    on_update(final)  # what the accounting said (sacct unreadable)
                return final
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
            if isinstance(exc, KeyboardInterrupt):
                # the interrupt goes on (exit 130/143), saying what is left to cancel
                exc.args = (str(stop_exc),)
                return
            raise SlurmError(f"{exc}; and stopping the array failed: {stop_exc}") from exc


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
