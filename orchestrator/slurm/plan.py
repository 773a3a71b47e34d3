"""One job array, planned (pure): folder, batch script and ``sbatch`` argv (docs/slurm.md)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.slurm.role import SlurmError, SlurmRole
from orchestrator.transport.hosts import quote
from remote.protocol import is_int

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
# under Slurm's default MaxArraySize
MAX_TASKS = 1000


@dataclass(frozen=True)
class ArrayPlan:
    """`tasks` array tasks each running argv `command` in the job folder under `role`'s limits."""

    role: SlurmRole
    name: str
    tasks: int
    command: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not RUN_NAME.fullmatch(self.name):
            raise SlurmError(
                f"name: {self.name!r} is not a job name (letters, digits, '.', '_', '-'; "
                "at most 100, starting with a letter or digit)"
            )
        if not is_int(self.tasks):
            raise SlurmError(f"tasks: {self.tasks!r} is not a whole number")
        if not 1 <= self.tasks <= MAX_TASKS:
            raise SlurmError(f"tasks: {self.tasks} is not between 1 and {MAX_TASKS}")
        if (
            not isinstance(self.command, tuple)
            or not self.command
            or not all(isinstance(a, str) and "\0" not in a for a in self.command)
        ):
            raise SlurmError("command: expected a non-empty tuple of strings (an argv)")

    @property
    def folder(self) -> str:
        return posixpath.join(self.role.shared, self.name)

    @property
    def task_ids(self) -> tuple[int, ...]:
        return tuple(range(self.tasks))

    def exit_record(self, task_id: int, job_id: int) -> str:
        """Where the wrapper writes `task_id`'s exit code for the array job `job_id`."""
        return posixpath.join(self.folder, "tasks", f"{task_id}.{job_id}.exit")

    def script(self) -> str:
        """The ``/bin/sh`` batch script: the command, its exit code recorded atomically."""
        tasks = quote(posixpath.join(self.folder, "tasks"))
        return "\n".join(
            [
                "#!/bin/sh",
                f"# dflash array {self.name}: written by the controller, submitted by sbatch",
                " ".join(quote(a) for a in self.command),
                "code=$?",
                f'record={tasks}/"$SLURM_ARRAY_TASK_ID.$SLURM_ARRAY_JOB_ID"',
                'printf \'%s\\n\' "$code" > "$record.partial" '
                '&& mv -f "$record.partial" "$record.exit"',
                'exit "$code"',
                "",
            ]
        )

    def sbatch_argv(self, task_ids: Iterable[int]) -> list[str]:
        """``sbatch`` for `task_ids`, ``--no-requeue``: retries counted here."""
        ids = sorted(set(task_ids))
        if not ids or any(i not in range(self.tasks) for i in ids):
            raise SlurmError(f"task ids {ids} are not a non-empty subset of 0..{self.tasks - 1}")
        role = self.role
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={self.name}",
            f"--array={array_spec(ids)}",
            "--no-requeue",
            f"--chdir={self.folder}",
            f"--output={self.folder}/logs/%A_%a.out",
            f"--time={role.time_limit_minutes}",
            f"--cpus-per-task={role.cpus_per_task}",
            "--ntasks=1",
        ]
        for flag, value in (
            ("--partition", role.partition),
            ("--account", role.account),
            ("--qos", role.qos),
            ("--mem", f"{role.mem_per_task_mib}M" if role.mem_per_task_mib else None),
        ):
            if value is not None:
                argv.append(f"{flag}={value}")
        return argv


def array_spec(ids: list[int]) -> str:
    """Sorted task ids as sbatch's ``--array`` list, runs folded: [0,1,2,5] -> ``0-2,5``."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)
