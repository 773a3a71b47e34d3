"""A Slurm eval's view: a row per array task, and a line when an attempt fails or its retry
starts (docs/slurm.md, "Told as it happens"), bars shown or not."""

from __future__ import annotations

from orchestrator.commands.output.base import plain
from orchestrator.commands.output.progress import ShardProgress


def failed_line(label: str, ev: dict) -> str:
    """``login#1: attempt 1 of 2 (58_1) failed: node failure on n2; retrying as 59_1``."""
    then = f"retrying as {ev['retry']}" if ev.get("retry") else "no retries left"
    return (
        f"{label}: attempt {ev.get('attempt')} of {ev.get('max_attempts')} ({ev.get('job')}) "
        f"failed: {ev.get('why') or ev.get('state')}; {then}"
    )


def retry_line(label: str, ev: dict) -> str:
    """``login#1: retry 59_1 (attempt 2 of 2) started on n1``."""
    where = f" on {ev['nodes']}" if ev.get("nodes") else ""
    return (
        f"{label}: retry {ev.get('job')} (attempt {ev.get('attempt')} of "
        f"{ev.get('max_attempts')}) started{where}"
    )


class SlurmShardProgress(ShardProgress):
    """`ShardProgress` that also tells ``slurm_task`` events."""

    def __init__(self, enabled: bool = True):
        super().__init__(enabled)
        self.started: set[str] = set()  # retries told

    def __call__(self, host: str, ev: dict) -> None:
        if ev.get("event") != "slurm_task":
            super().__call__(host, ev)
            return
        if ev.get("verdict") == "failed":
            if ev.get("retry"):
                self._afresh(host)
            self._say(f"[bold red]{plain(failed_line(host, ev))}[/]")
        elif ev.get("attempt", 1) > 1 and ev.get("verdict") != "queued":
            if ev.get("job") not in self.started:
                self.started.add(ev.get("job"))
                self._say(f"[yellow]{plain(retry_line(host, ev))}[/]")

    def _afresh(self, host: str) -> None:
        """The task's row as at its start: the failed attempt's samples no longer count."""
        if host not in self.rows:
            return
        h = self.hosts[host]
        h.update(done=0, tokens=0, started=None, last=None, tau=None)
        self._render(self.rows[host], h)
        self._total()

    def _say(self, line: str) -> None:
        self.progress.console.print(line, soft_wrap=True)
        self.progress.console.file.flush()
