"""What the login node answers, parsed strictly: exactly the shape asked for, else one line
naming the host and the field (the scheduler is another trust domain)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.slurm import states
from orchestrator.slurm.role import SlurmError

# Without widths squeue prints each field whole; the reason, last, is the only free text.
QUEUE_FORMAT = "%F|%K|%T|%N|%r"
_JOB_ID = re.compile(r"[1-9][0-9]{0,9}")
_TASK_ID = re.compile(r"0|[1-9][0-9]{0,6}")
_PARSABLE = re.compile(rf"({_JOB_ID.pattern})(?:;[A-Za-z0-9_.-]{{1,64}})?")
_NODES = re.compile(r"[A-Za-z0-9_.\[\],-]{0,1024}")
_REASON = re.compile(r"[\x20-\x7e]{0,512}")
_EXIT_LINE = re.compile(rf"({_TASK_ID.pattern})\.({_JOB_ID.pattern})\.exit (0|[1-9][0-9]{{0,2}})")


@dataclass(frozen=True)
class TaskRecord:
    """One array task as ``squeue`` lists it."""

    job_id: int
    task_id: int
    state: str
    nodes: str
    reason: str


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")


def job_id(host: str, stdout: str) -> int:
    """The array job id ``sbatch --parsable`` printed (``57`` or ``57;cluster``)."""
    m = _PARSABLE.fullmatch(stdout.strip())
    if not m:
        raise SlurmError(f"{host}: sbatch answered a job id that is not a number: {_shown(stdout)}")
    return int(m.group(1))


def queue(
    host: str, stdout: str, asked: dict[int, frozenset[int]]
) -> dict[tuple[int, int], TaskRecord]:
    """``squeue`` lines as records by (job, task); a line about a task not in `asked` (job
    id -> its submitted task ids), a repeat or a field out of shape is refused."""
    records: dict[tuple[int, int], TaskRecord] = {}
    for n, line in enumerate(stdout.splitlines(), 1):
        parts = line.split("|", 4)
        if len(parts) != 5:
            raise SlurmError(
                f"{host}: squeue line {n} has {len(parts)} fields, not 5 "
                f"({QUEUE_FORMAT}): {_shown(line)}"
            )
        job, task, state, nodes, reason = parts
        if not _JOB_ID.fullmatch(job):
            raise SlurmError(f"{host}: squeue line {n}: array job id {_shown(job)} is not a job id")
        if not _TASK_ID.fullmatch(task):
            raise SlurmError(
                f"{host}: squeue line {n}: array task id {_shown(task)} is not a task id"
            )
        key = (int(job), int(task))
        if key[0] not in asked or key[1] not in asked[key[0]]:
            raise SlurmError(
                f"{host}: squeue line {n}: task {job}_{task} is not one dflash submitted"
            )
        if not states.is_known(state) or state == states.LOST:
            raise SlurmError(
                f"{host}: squeue line {n}: state {_shown(state)} of task {job}_{task} is not "
                "a Slurm job state"
            )
        if not _NODES.fullmatch(nodes):
            raise SlurmError(
                f"{host}: squeue line {n}: node list {_shown(nodes)} of task {job}_{task} "
                "is not a Slurm host list"
            )
        if not _REASON.fullmatch(reason):
            raise SlurmError(
                f"{host}: squeue line {n}: reason {_shown(reason)} of task {job}_{task} is "
                "not one line of printable text"
            )
        if key in records:
            raise SlurmError(f"{host}: squeue listed task {job}_{task} twice")
        records[key] = TaskRecord(key[0], key[1], state, nodes, reason)
    return records


def exit_codes(host: str, stdout: str, asked: set[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """The job folder's exit records (``<task>.<job>.exit <code>`` lines) by (job, task)."""
    codes: dict[tuple[int, int], int] = {}
    for line in stdout.splitlines():
        m = _EXIT_LINE.fullmatch(line)
        key = (int(m.group(2)), int(m.group(1))) if m else None
        if not m or key not in asked or key in codes or int(m.group(3)) > 255:
            raise SlurmError(
                f"{host}: the job folder's exit record line {_shown(line)} is not one asked for"
            )
        codes[key] = int(m.group(3))
    return codes


ACCOUNT_FORMAT = "JobID,State,ExitCode,ElapsedRaw,MaxRSS"
ACCOUNT_MAX_BYTES = 4 * 1024 * 1024
_ACCT_JOB = re.compile(
    rf"({_JOB_ID.pattern})_(?:({_TASK_ID.pattern})|\[[0-9,%-]{{1,1024}}\])"
    r"(?:\.([A-Za-z0-9_+-]{1,32}))?"
)
_ACCT_STATE = re.compile(r"([A-Z_]{1,32})(?: by (?:0|[1-9][0-9]{0,9}))?")
_ACCT_EXIT = re.compile(r"(0|[1-9][0-9]{0,2}):(0|[1-9][0-9]{0,2})")
_ELAPSED = re.compile(r"0|[1-9][0-9]{0,9}")
# empty on the allocation's own line, which has no step to measure
_RSS = re.compile(r"(?:(0|[1-9][0-9]{0,14})(?:\.([0-9]{1,6}))?([KMGTP]?))?")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


@dataclass(frozen=True)
class Accounted:
    """One array task as sacct has it; `max_rss_bytes`: the largest of its steps'."""

    job_id: int
    task_id: int
    state: str
    exit_code: int
    signal: int
    elapsed_s: int
    max_rss_bytes: int | None

    def to_json(self) -> dict:
        return {
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "elapsed_s": self.elapsed_s,
            "max_rss_bytes": self.max_rss_bytes,
        }


def _rss(host: str, n: int, text: str) -> int | None:
    m = _RSS.fullmatch(text)
    if not m:
        raise SlurmError(f"{host}: sacct line {n}: MaxRSS {_shown(text)} is not a size")
    if not m.group(1):
        return None
    whole, frac, unit = m.group(1), m.group(2) or "", m.group(3)
    return (int(whole + frac) * _UNITS[unit]) // (10 ** len(frac))


def accounting(
    host: str, stdout: str, asked: dict[int, frozenset[int]]
) -> dict[tuple[int, int], Accounted]:
    """``sacct`` lines as records by (job, task), checked as strictly as `queue`; a pending
    remainder (``57_[2-5]``) is skipped, a step adds only its peak RSS."""
    if len(stdout) > ACCOUNT_MAX_BYTES:
        raise SlurmError(f"{host}: sacct answered more than {ACCOUNT_MAX_BYTES} bytes")
    tasks: dict[tuple[int, int], list] = {}
    rss: dict[tuple[int, int], int] = {}
    for n, line in enumerate(stdout.splitlines(), 1):
        parts = line.split("|")
        if len(parts) != 5:
            raise SlurmError(
                f"{host}: sacct line {n} has {len(parts)} fields, not 5 "
                f"({ACCOUNT_FORMAT}): {_shown(line)}"
            )
        job, state, code, elapsed, max_rss = parts
        m = _ACCT_JOB.fullmatch(job)
        if not m:
            raise SlurmError(f"{host}: sacct line {n}: job id {_shown(job)} is not an array task")
        if m.group(2) is None:
            continue
        key = (int(m.group(1)), int(m.group(2)))
        if key[0] not in asked or key[1] not in asked[key[0]]:
            raise SlurmError(f"{host}: sacct line {n}: task {key[0]}_{key[1]} is not one asked")
        size = _rss(host, n, max_rss)
        if size is not None:
            rss[key] = max(rss.get(key, 0), size)
        if m.group(3) is not None:
            continue
        sm, em = _ACCT_STATE.fullmatch(state), _ACCT_EXIT.fullmatch(code)
        if not sm or not states.is_known(sm.group(1)) or sm.group(1) == states.LOST:
            raise SlurmError(
                f"{host}: sacct line {n}: state {_shown(state)} of task {job} is not a Slurm "
                "job state"
            )
        if not em or int(em.group(1)) > 255 or int(em.group(2)) > 255:
            raise SlurmError(
                f"{host}: sacct line {n}: exit code {_shown(code)} of task {job} is not "
                "<code>:<signal>"
            )
        if not _ELAPSED.fullmatch(elapsed):
            raise SlurmError(
                f"{host}: sacct line {n}: elapsed {_shown(elapsed)} of task {job} is not "
                "whole seconds"
            )
        if key in tasks:
            raise SlurmError(f"{host}: sacct listed task {job} twice")
        tasks[key] = [sm.group(1), int(em.group(1)), int(em.group(2)), int(elapsed)]
    return {k: Accounted(*k, *v, rss.get(k)) for k, v in tasks.items()}
