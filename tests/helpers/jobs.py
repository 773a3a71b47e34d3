"""An eval job run in this process, as a host runs it, its events kept in a list."""

from __future__ import annotations

from pathlib import Path


class Events:
    """A job's events and written records, in order: ``log``."""

    def __init__(self):
        self.log: list[dict] = []

    def emit(self, event: str, **fields) -> None:
        self.log.append({"event": event, **fields})

    def write(self, obj: dict) -> None:
        self.log.append(obj)


def run_eval_job(folder: Path, spec: dict) -> list[dict]:
    """Run the eval job `spec` in `folder` (made here), preflight first; its events."""
    from remote.eval.job import run_job

    folder.mkdir(parents=True)
    events = Events()
    assert run_job(folder, spec, events, preflight=True) == 0
    return events.log
