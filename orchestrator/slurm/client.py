"""Slurm's commands on a login node, arguments quoted, answers parsed (docs/slurm.md)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from orchestrator.errors import DflashError
from orchestrator.slurm import answers
from orchestrator.slurm.answers import Accounted, TaskRecord
from orchestrator.slurm.plan import RUN_NAME, ArrayPlan
from orchestrator.slurm.role import SlurmError
from orchestrator.transport.hosts import Host, last_line, quote

COMMAND_TIMEOUT = 60.0
# squeue's answer for ONE job id it no longer knows (with several ids it lists the others).
_UNKNOWN_JOB = "Invalid job id specified"
_TARGET = re.compile(r"[1-9][0-9]{0,9}(_(0|[1-9][0-9]{0,6}))?")


class SlurmClient:
    """The Slurm commands dflash runs on `host`, a cluster's login node."""

    def __init__(self, host: Host, *, command_timeout: float = COMMAND_TIMEOUT):
        self.host = host
        self.timeout = command_timeout
        self.accounting_off: str | None = None
        self.accounting_unreadable = False

    @property
    def name(self) -> str:
        return self.host.name

    def make_folder(self, plan: ArrayPlan) -> None:
        """Create the job folder; an existing one is refused."""
        folder = plan.folder
        subs = " ".join(quote(posixpath.join(folder, d)) for d in ("logs", "tasks"))
        line = (
            f"mkdir -p {quote(plan.role.shared)} && {{ mkdir {quote(folder)} || exit 3; }} && "
            f"mkdir {subs}"
        )
        result = self.host.run(line, check=False, timeout=self.timeout)
        if result.exit_code == 3:
            raise SlurmError(
                f"{self.name}: job folder {folder} exists already; give the run another name"
            )
        if not result.ok:
            raise SlurmError(
                f"{self.name}: could not make job folder {folder}: {last_line(result.stderr)}"
            )

    def submit(self, plan: ArrayPlan, task_ids: Iterable[int]) -> int:
        """Submit `task_ids` of the plan as one array; its array job id."""
        argv = plan.sbatch_argv(task_ids)
        result = self.host.run(
            argv, check=False, timeout=self.timeout, stdin=plan.script().encode()
        )
        if not result.ok:
            raise SlurmError(
                f"{self.name}: sbatch refused array {plan.name}: "
                f"{last_line(result.stderr) or f'exit {result.exit_code}'}"
            )
        return answers.job_id(self.name, result.stdout)

    def queue(self, asked: dict[int, frozenset[int]]) -> dict[tuple[int, int], TaskRecord]:
        """What ``squeue`` lists for the array jobs in `asked`, by (job, task)."""
        if not asked:
            return {}
        ids = ",".join(str(j) for j in sorted(asked))
        argv = ["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", answers.QUEUE_FORMAT]
        result = self.host.run(argv, check=False, timeout=self.timeout)
        if not result.ok:
            if len(asked) == 1 and _UNKNOWN_JOB in result.stderr:
                return {}
            raise SlurmError(
                f"{self.name}: squeue failed: {last_line(result.stderr) or result.exit_code}"
            )
        return answers.queue(self.name, result.stdout, asked)

    def accounting(
        self, asked: dict[int, frozenset[int]]
    ) -> dict[tuple[int, int], Accounted] | None:
        """``sacct``'s records of `asked`; None where it does not work."""
        if self.accounting_off is not None:
            return None
        if not asked:
            return {}
        try:
            return self._accounting(asked)
        except DflashError as exc:
            self.accounting_unreadable = True
            self.accounting_off = f"sacct's answer was unreadable: {exc}"
            return None

    def _accounting(
        self, asked: dict[int, frozenset[int]]
    ) -> dict[tuple[int, int], Accounted] | None:
        ids = ",".join(str(j) for j in sorted(asked))
        argv = ["sacct", "--parsable2", "--noheader", "-j", ids]
        argv.append(f"--format={answers.ACCOUNT_FORMAT}")
        cmd = " ".join(quote(a) for a in argv)
        line = (
            f'out=$({cmd}) || exit $?; printf "%s\\n" "$out" | '
            f"head -c {answers.ACCOUNT_MAX_BYTES + 1}"
        )
        result = self.host.run(line, check=False, timeout=self.timeout)
        if not result.ok:
            self.accounting_off = f"sacct: {last_line(result.stderr) or f'exit {result.exit_code}'}"
            return None
        return answers.accounting(self.name, result.stdout, asked)

    def exit_codes(
        self, plan: ArrayPlan, attempts: Iterable[tuple[int, int]]
    ) -> dict[tuple[int, int], int]:
        """The exit codes the job folder recorded for `attempts`; one without a record is absent."""
        asked = set(attempts)
        if not asked:
            return {}
        names = " ".join(quote(f"{task}.{job}.exit") for job, task in sorted(asked))
        line = (
            f"cd {quote(posixpath.join(plan.folder, 'tasks'))} && for f in {names}; do "
            'if [ -f "$f" ]; then printf \'%s %s\\n\' "$f" "$(head -c 16 -- "$f")"; fi; done'
        )
        result = self.host.run(line, check=False, timeout=self.timeout)
        if not result.ok:
            raise SlurmError(
                f"{self.name}: could not read exit records in {plan.folder}: "
                f"{last_line(result.stderr)}"
            )
        return answers.exit_codes(self.name, result.stdout, asked)

    def cancel(self, targets: Iterable[str], timeout: float | None = None) -> str:
        """``scancel`` jobs or tasks; its complaint (judged by ``squeue``)."""
        ids = sorted(set(targets))
        if not ids:
            return ""
        bad = [t for t in ids if not _TARGET.fullmatch(t)]
        if bad:
            raise SlurmError(f"{self.name}: not a job or task id to cancel: {bad[0]!r}")
        result = self.host.run(["scancel", *ids], check=False, timeout=timeout or self.timeout)
        return "" if result.ok else last_line(result.stderr) or f"exit {result.exit_code}"

    def cancel_named(self, names: Iterable[str]) -> str:
        """``scancel --name`` a run's arrays, left by a controller that died; the complaints."""
        said = []
        for name in sorted(set(names)):
            if not RUN_NAME.fullmatch(name):
                raise SlurmError(f"{self.name}: not an array name to cancel: {name!r}")
            result = self.host.run(["scancel", f"--name={name}"], check=False, timeout=self.timeout)
            if not result.ok:
                said.append(last_line(result.stderr) or f"exit {result.exit_code}")
        return "; ".join(said)
