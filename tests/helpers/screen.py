"""The CLI's own stdout console at a chosen width for a test, then unpinned again (as
`orchestrator.commands.output.base` makes it: its width follows COLUMNS and the terminal)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def console_at(width: int) -> Iterator[Any]:
    from orchestrator.commands.output import base

    con = base.console
    con.width = width
    try:
        yield con
    finally:
        con.width = None  # restoring a number would pin it for every later test
