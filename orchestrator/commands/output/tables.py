"""Every table the CLI prints: ids and numbers never cut (docs/results.md, "Any name")."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from rich import box as boxes
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from orchestrator.printable import printable

Kind = Literal["id", "num", "text"]

# Columns go before a text column is narrowed below TEXT_MIN: a folded path is unreadable.
TEXT_MIN = 12
TEXT_FLOOR = 6


@dataclass(frozen=True)
class Fit:
    """How a table is drawn to fit: compact, headers wrapped, text columns' width."""

    compact: bool = False
    headers: bool = False
    text: int | None = None


def styled(value: Any, style: str) -> Text:
    """A cell (or a line) in `style`: its value as literal text, never markup."""
    return Text(printable(str(value)), style=style)


def cell(value: Any) -> Text:
    """A value as a cell: a `Text` kept as it is, anything else as literal text."""
    if isinstance(value, Text):
        return value
    return Text(printable("" if value is None else str(value)))


@dataclass(frozen=True)
class Col:
    """One column: ``id``/``num`` never cut, ``text`` wraps; ``drop``: rank for leaving it
    out when too wide (0: always shown; higher goes first)."""

    header: str
    kind: Kind = "text"
    justify: Literal["left", "right", "center"] = "left"
    drop: int = 0
    style: str | None = None


class Grid:
    """A table that fits itself to the console at render time; print it with `base.show`."""

    def __init__(
        self,
        title: str | None = None,
        columns: Iterable[Col | str] = (),
        *,
        compact: bool = True,
        show_header: bool = True,
    ) -> None:
        self.title = title
        self.columns = [c if isinstance(c, Col) else Col(c) for c in columns]
        self.compact = compact
        self.show_header = show_header
        self.rows: list[list[Text]] = []

    def row(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([cell(c) for c in cells])

    def _header(self, i: int, wrap: bool) -> Text:
        """Column `i`'s header; with `wrap`, broken at spaces to its values' width."""
        header = printable(self.columns[i].header)
        if not wrap:
            return Text(header)
        widest = max((ln for r in self.rows for ln in map(len, r[i].plain.split("\n"))), default=1)
        words = header.split()
        width = max([widest, *map(len, words)]) if words else widest
        return Text(textwrap.fill(header, width) if words else header)

    def _table(self, keep: list[int], fit: Fit, caption: str | None = None) -> Table:
        """The rich table of the columns `keep`, drawn as `fit` says."""
        style: dict[str, Any] = (
            {
                "box": boxes.SIMPLE_HEAD,
                "padding": (0, 1),
                "collapse_padding": True,
                "pad_edge": False,
                "show_edge": False,
            }
            if self.compact or fit.compact
            else {}
        )
        table = Table(
            title=Text(printable(self.title)) if self.title else None,
            caption=Text(caption, style="dim") if caption else None,
            show_header=self.show_header,
            **style,
        )
        for i in keep:
            c = self.columns[i]
            wraps = c.kind == "text"
            table.add_column(
                self._header(i, fit.headers),
                justify=c.justify,
                style=c.style,
                no_wrap=not wraps,
                overflow="fold",  # never replaced by "…"
                max_width=fit.text if (fit.text and wraps) else None,
            )
        for r in self.rows:
            table.add_row(*[r[i] for i in keep])
        return table

    def _needed(self, console: Console, options: ConsoleOptions, keep: list[int], fit: Fit) -> int:
        """The narrowest width the columns `keep` fit in without cutting an id or number."""
        probe = self._table(keep, fit)
        return Measurement.get(console, options.update_width(1 << 16), probe).maximum

    def fit(self, console: Console, options: ConsoleOptions) -> tuple[Table, int]:
        """The table and the width to draw it at, fitted as docs/results.md says."""
        keep = list(range(len(self.columns)))
        width = options.max_width
        for fit in (Fit(text=TEXT_MIN), Fit(compact=True, headers=True, text=TEXT_MIN)):
            needed = self._needed(console, options, keep, fit)
            if needed <= width:
                return self._table(keep, replace(fit, text=None)), width
        ranked = sorted(
            (i for i, c in enumerate(self.columns) if c.drop),
            key=lambda i: (-self.columns[i].drop, -i),
        )
        dropped: list[int] = []
        for i in ranked:
            if needed <= width:
                break
            keep.remove(i)
            dropped.append(i)
            needed = self._needed(console, options, keep, fit)
        if needed > width:
            fit = Fit(compact=True, headers=True, text=TEXT_FLOOR)
            needed = self._needed(console, options, keep, fit)
        caption = None
        if dropped:
            names = ", ".join(self.columns[i].header for i in sorted(dropped))
            caption = f"left out at this width: {names} (a wider terminal or --json shows them)"
        return self._table(keep, replace(fit, text=None), caption), max(width, needed)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table, width = self.fit(console, options)
        yield from console.render(table, options.update_width(width))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        table, width = self.fit(console, options)
        return Measurement.get(console, options.update_width(width), table)


def kv(title: str | None, pairs: Iterable[tuple[Any, Any]], key_style: str = "bold") -> Grid:
    """A two-column table of (key, value) rows without a header; both wrap."""
    grid = Grid(
        title,
        [Col("key", style=key_style), Col("value")],
        compact=False,
        show_header=False,
    )
    for k, v in pairs:
        grid.row(k, v)
    return grid
