"""One job array, submitted, watched, retried and cancelled on any way out (docs/slurm.md)."""

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

# longer than Slurm's KillWait
CANCEL_TIMEOUT = 90.0
# a hung scancel must not hold a Ctrl-C for long
STOP_COMMAND_TIMEOUT = 15.0
# squeue may list an attempt as running after its exit record is written
EXIT_GRACE = 30.0


class ArrayRun:
    """One array's mutable side; `status` its frozen picture; `retry`: states to resubmit."""

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
        self._accounted = False
        self._notes: list[str] = []
        self._recorded: dict[tuple[int, int], float] = {}
        self._next_record_look = 0.0

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
        """Say `line` in the status: a fallback or a decision taken on the way."""
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
        """`start` into a job folder the caller made (and put the tasks' inputs in)."""
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
        """Look once; with `resubmit`, resubmit the retryable failures as one array."""
        active = self.status.active
        asked: dict[int, set[int]] = {}
        for a in active:
            asked.setdefault(a.job_id, set()).add(a.task_id)
        # squeue lists ended tasks too (MinJobAge): validate against every submitted one.
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
        """The attempts whose exit records this look reads (docs/slurm.md)."""
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
        """Every attempt's sacct record, where the cluster keeps accounting; the status."""
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
        """`SlurmClient.accounting`, noting the first unreadable answer (not a refusal)."""
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
        """``scancel`` the active attempts of `task_ids` (None: all); scancel's complaint."""
        wanted = None if task_ids is None else set(task_ids)
        refs = [a.ref for a in self.status.active if wanted is None or a.task_id in wanted]
        return self.client.cancel(refs, timeout=timeout)

    def stop(self, timeout: float = CANCEL_TIMEOUT) -> ArrayStatus:
        """Cancel every active attempt; `SlurmError` naming what to cancel by hand."""
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
        """One line: the array may still hold the cluster (`what`), and the scancel to run."""
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
        """Look every `poll_seconds` until all ended; on timeout or error `stop`, raise."""
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
                    on_update(final)
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
    """Submit `plan` as one array and watch it to the end; nothing is left queued on any way out."""
    run = ArrayRun(client, plan)
    run.start()
    return run.wait(timeout, on_update)
