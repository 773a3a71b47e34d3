"""What a relay tells: live progress, its errors, and the report ``--json`` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.errors import DflashError


class RelayError(DflashError):
    """The relay cannot start or did not finish; one line says what to do."""


class RelayIncomplete(RelayError):
    """The relay ran, but a destination failed or a checkpoint asked for was skipped."""

    exit_code = 1


class Progress:
    """Receives progress: the CLI draws a bar from it."""

    def start(self, total_bytes: int, total_files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file_done(self, checkpoint: str, path: str) -> None:
        pass

    def message(self, text: str) -> None:
        pass


@dataclass
class DestStatus:
    host: str
    status: str = "pending"  # relayed | unchanged | verified | repaired | failed | planned
    bytes_planned: int = 0
    bytes_sent: int = 0
    bytes_skipped: int = 0
    files_sent: int = 0
    # kept-prefix bytes hashed again (no saved hash state)
    prefix_hashed: int = 0
    repaired: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class CheckpointReport:
    name: str
    step: int | None
    size: int
    files: int
    destinations: dict[str, DestStatus] = field(default_factory=dict)


@dataclass
class RelayReport:
    """The whole relay: what was sent where, skipped, pruned, and how fast."""

    source: str
    source_dir: str
    destinations: dict[str, str]
    dry_run: bool = False
    checkpoints: list[CheckpointReport] = field(default_factory=list)
    incomplete: list[dict] = field(default_factory=list)
    pruned: dict[str, list[str]] = field(default_factory=dict)
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def bytes_sent(self) -> int:
        return sum(d.bytes_sent for c in self.checkpoints for d in c.destinations.values())

    @property
    def bytes_skipped(self) -> int:
        return sum(d.bytes_skipped for c in self.checkpoints for d in c.destinations.values())

    @property
    def files_sent(self) -> int:
        return sum(d.files_sent for c in self.checkpoints for d in c.destinations.values())

    @property
    def failures(self) -> list[tuple[str, str, str]]:
        return [
            (c.name, d.host, d.error or "failed")
            for c in self.checkpoints
            for d in c.destinations.values()
            if d.status == "failed"
        ]

    @property
    def skipped_named(self) -> list[dict]:
        return [i for i in self.incomplete if i.get("named")]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.skipped_named

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "source_dir": self.source_dir,
            "destinations": self.destinations,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "bytes_read": self.bytes_read,
            "bytes_sent": self.bytes_sent,
            "bytes_planned": sum(
                d.bytes_planned for c in self.checkpoints for d in c.destinations.values()
            ),
            "bytes_skipped": self.bytes_skipped,
            "files_sent": self.files_sent,
            "seconds": round(self.seconds, 3),
            "mib_per_s": round(self.bytes_read / self.seconds / 2**20, 1)
            if self.seconds > 0
            else None,
            "checkpoints": [
                {
                    "name": c.name,
                    "step": c.step,
                    "size": c.size,
                    "files": c.files,
                    "destinations": {h: asdict(d) for h, d in c.destinations.items()},
                }
                for c in self.checkpoints
            ],
            "incomplete": self.incomplete,
            "pruned": self.pruned,
        }
