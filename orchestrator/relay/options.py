"""What a relay is asked to do, and how its host-side commands start."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from remote.relay.wire import PATIENCE

# Host relay commands are stdlib only: no site-packages, a faster start.
RELAY_PYTHON_FLAGS = ("-I", "-S")


@dataclass
class RelayOptions:
    """What to relay and how; with no selection, the newest complete checkpoint."""

    names: list[str] = field(default_factory=list)
    step: int | None = None
    latest: bool = False
    all: bool = False
    src_dir: str | None = None
    dest_dir: str | None = None
    verify: bool = False
    dry_run: bool = False
    keep: int | None = None
    jobs: int | None = None
    reserve: int | None = None  # None: the eval role's `reserve`
    lock_wait: float = 5.0
    # Seconds with no byte moving before a stream is ended.
    stall: float = PATIENCE / 2

    @property
    def patience(self) -> float:
        return host_patience(self.stall)


def host_patience(stall: float) -> float:
    """A host command's ``--patience``: twice the relay's `stall`, so it notices first."""
    return 2 * stall


def default_jobs() -> int:
    """Streams at once when not told: one per two local cores, 1 to 4."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))
