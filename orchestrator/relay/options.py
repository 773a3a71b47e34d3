"""What a relay is asked to do (`RelayOptions`) and how its host-side commands start."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from remote.relay.wire import PATIENCE

# The host-side relay commands are stdlib only: skip site-packages and environment
# (-I -S), which halves the interpreter's start on a host with many packages.
RELAY_PYTHON_FLAGS = ("-I", "-S")


@dataclass
class RelayOptions:
    """What to relay and how. With no selection the newest complete checkpoint is relayed."""

    names: list[str] = field(default_factory=list)
    step: int | None = None
    latest: bool = False
    all: bool = False
    src_dir: str | None = None
    dest_dir: str | None = None
    verify: bool = False
    dry_run: bool = False
    keep: int | None = None
    jobs: int | None = None  # streams at once; None: `default_jobs()`
    reserve: int | None = None  # bytes to leave free; None: the eval role's `reserve`
    lock_wait: float = 5.0  # seconds to wait for another relay into a destination folder
    # Seconds with no byte moving before a stream is ended (this side's patience); the
    # hosts' patience with this relay is twice that (`patience`).
    stall: float = PATIENCE / 2

    @property
    def patience(self) -> float:
        """The hosts' patience with this relay (`host_patience` of `stall`)."""
        return host_patience(self.stall)


def host_patience(stall: float) -> float:
    """Seconds a host-side relay command waits on a silent relay before it ends
    (``--patience``; `remote.relay.patience`) when the relay itself gives up on a stalled
    stream after `stall`: twice that, so a stalled stream is noticed here first, and an
    idle lock holder is pinged four times within it."""
    return 2 * stall


def default_jobs() -> int:
    """Streams at once when not told: one per two of this machine's cores, 1 to 4.

    Every stream keeps about two cores here busy (one ssh decrypting what the source
    sends, one encrypting it for the destination). On an idle 2-core box an 8 x 64 MiB
    checkpoint took 3.7 s with 1 or 2 streams and 4.1 s with 4 (processes fighting for
    the cores); more than one stream pays off where one ssh stream is cipher-bound.
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2))
