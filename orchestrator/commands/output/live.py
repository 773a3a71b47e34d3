"""Live views opened only when shown: with ``--json`` their modules are not even imported."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.commands.output.relaybar import RelayProgress


@contextmanager
def relay_bar(enabled: bool = True) -> Iterator[RelayProgress | None]:
    """A `RelayProgress` stopped on the way out; None when not `enabled`."""
    if not enabled:
        yield None
        return
    from orchestrator.commands.output.relaybar import RelayProgress

    with RelayProgress() as bar:
        yield bar
