"""Live progress of a Slurm eval's tasks: the lines each attempt's job appended to its
``events.jsonl`` on the shared folder since the last look, for every attempt at once in
ONE login-node command, each event checked as a watch's is (`jobwire.checked`).

Read only while an attempt runs and once after it ended; at most `TAIL_MAX` bytes of one
file per look (the rest comes at the next), and only whole lines are taken.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from orchestrator.errors import RemoteCommandError
from orchestrator.eval import jobwire
from orchestrator.transport.hosts import Host, last_line
from orchestrator.transport.lines import MiB

TAIL_MAX = 4 * MiB
TAIL_TIMEOUT = 60.0
# For each "<offset>:<path>" argument: the path, NUL, the file's bytes from that offset
# (at most TAIL_MAX), NUL. Events are JSON lines (ASCII): no NUL inside.
_SCRIPT = (
    'for a in "$@"; do f=${a#*:}; o=${a%%:*}; printf \'%s\\0\' "$f"; '
    f"tail -c +$((o+1)) -- \"$f\" 2>/dev/null | head -c {TAIL_MAX}; printf '\\0'; done"
)


class EventTail:
    """The events of the jobs in one workdir (``<work>/jobs/<job id>/events.jsonl``), read
    from where the last look left each."""

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
