"""Live progress of a Slurm eval's tasks, read in one login-node command a look."""

from __future__ import annotations

import json
from collections.abc import Iterable

from orchestrator.errors import RemoteCommandError
from orchestrator.eval import jobwire
from orchestrator.transport.hosts import Host, last_line
from orchestrator.transport.lines import MiB

TAIL_MAX = 4 * MiB
TAIL_TIMEOUT = 60.0
# Per "<offset>:<path>": path NUL bytes-from-offset NUL (JSON lines hold no NUL).
_SCRIPT = (
    'for a in "$@"; do f=${a#*:}; o=${a%%:*}; printf \'%s\\0\' "$f"; '
    f"tail -c +$((o+1)) -- \"$f\" 2>/dev/null | head -c {TAIL_MAX}; printf '\\0'; done"
)


class EventTail:
    """The jobs' ``events.jsonl`` in one workdir, each read on from where the last look left it."""

    def __init__(self, host: Host, work: str):
        self.host = host
        self.work = work
        self.offsets: dict[str, int] = {}

    def read(self, job_ids: Iterable[str]) -> dict[str, list[dict]]:
        """The new events of each job (by id), checked; a job with no file yet has none."""
        paths = {f"{self.work}/jobs/{jobwire.local_job_id(j)}/events.jsonl": j for j in job_ids}
        if not paths:
            return {}
        args = [f"{self.offsets.get(j, 0)}:{p}" for p, j in paths.items()]
        done = self.host.run(["sh", "-c", _SCRIPT, "sh", *args], check=False, timeout=TAIL_TIMEOUT)
        if not done.ok:
            raise RemoteCommandError(
                f"{self.host.name}: could not read the tasks' events: {last_line(done.stderr)}"
            )
        parts = done.stdout.split("\0")
        out: dict[str, list[dict]] = {}
        for path, chunk in zip(parts[0:-1:2], parts[1::2], strict=False):
            job = paths.get(path)
            if job is None:
                raise RemoteCommandError(f"{self.host.name}: events of a file not asked for")
            whole = chunk[: chunk.rfind("\n") + 1]
            self.offsets[job] = self.offsets.get(job, 0) + len(whole.encode())
            out[job] = [self._event(line) for line in whole.splitlines() if line.strip()]
        return out

    def _event(self, line: str) -> dict:
        try:
            event = json.loads(line)
        except ValueError:
            raise RemoteCommandError(f"{self.host.name}: a task's event is not JSON") from None
        return jobwire.checked(self.host, "event", event)


class TaskReporter:
    """Per look: each attempt's events, then state, then notes (retries after failures)."""

    def __init__(self, emit, tail: EventTail, name: str, label, max_attempts: int, on_failed):
        self.emit, self.tail, self.name, self.label = emit, tail, name, label
        self.max_attempts, self.on_failed = max_attempts, on_failed
        self.seen: dict[str, str] = {}
        self.ended: set[str] = set()  # job ids read once after their attempt ended
        self.said = 0

    def job_id(self, task: int, job: int) -> str:
        """The job id `remote.jobs.array` gives the attempt of `task` in array job `job`."""
        return f"{self.name}-{task}-{job}"

    def __call__(self, status) -> None:
        read: dict[str, int] = {}
        for t in status.tasks:
            for a in t.attempts:  # while it runs, and once after it ended
                job_id = self.job_id(t.task_id, a.job_id)
                if a.verdict != "queued" and job_id not in self.ended:
                    read[job_id] = t.task_id
                    if a.verdict not in ("queued", "running"):
                        self.ended.add(job_id)
        events = self.tail.read(read)
        for t in status.tasks:
            label = self.label(t.task_id)
            for n, a in enumerate(t.attempts, 1):
                job_id = self.job_id(t.task_id, a.job_id)
                for event in events.get(job_id, ()):
                    self.emit(label, event)
                if self.seen.get(a.ref) == a.state:
                    continue
                self.seen[a.ref] = a.state
                if a.verdict == "failed":
                    self.on_failed(t.task_id, a, self.tail.offsets.get(job_id, 0) > 0)
                self.emit(label, slurm_task(t, n, self.max_attempts))
        for line in status.notes[self.said :]:
            self.emit(self.label(None), {"event": "warning", "message": line})
        self.said = len(status.notes)


def slurm_task(task, n: int, max_attempts: int) -> dict:
    """The ``slurm_task`` event of attempt `n` (from 1) of `task`, with the retry's ref."""
    attempt = task.attempts[n - 1]
    return {
        "event": "slurm_task",
        "task": task.task_id,
        "attempt": n,
        "max_attempts": max_attempts,
        **attempt.to_json(),
        "retry": task.attempts[n].ref if n < len(task.attempts) else None,
    }
