"""The consoles, JSON or the human view (`emit`), `exit_with`, `show` and cell helpers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

from orchestrator.printable import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

T = TypeVar("T")

# Made on first use (PEP 562): a --json run printing no markup never pays rich's import.
_consoles: dict[str, Console] = {}
_consoles_lock = threading.Lock()


def _console(name: str) -> Console:
    with _consoles_lock:
        if not _consoles:
            from rich.console import Console

            for key, stderr in (("console", False), ("err_console", True)):
                made = Console(stderr=stderr, highlight=False)
                # Unpinned: each command in one process (tests, a notebook) gets its width.
                made.width = None  # type: ignore[assignment]
                _consoles[key] = made
        return _consoles[name]


def __getattr__(name: str) -> Any:
    if name in ("console", "err_console"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def print_json(obj: Any) -> None:
    """JSON on stdout, nothing else, so scripts can pipe it."""
    typer.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def emit(
    result: T,
    json_out: bool,
    human: Callable[[T], None],
    as_json: Callable[[T], Any] | None = None,
) -> None:
    """Show `result` as JSON or through `human`: the one place that branches on ``--json``."""
    if json_out:
        print_json(as_json(result) if as_json is not None else result)
    else:
        human(result)


def error_line(message: str) -> str:
    """A failure as the CLI words it: a red ``error:`` and the message as literal text."""
    return f"[bold red]error:[/] {plain(message)}"


def notes(lines: list[str]) -> None:
    """The library's notes on how it will run, one ``note:`` line each on stderr."""
    for line in lines:
        _console("err_console").print(f"[yellow]note:[/] {plain(line)}", soft_wrap=True)


def exit_with(code: int, *lines: str) -> NoReturn:
    """Exit `code` after markup `lines` on stderr, for outcomes already shown on stdout."""
    for line in lines:
        _console("err_console").print(line, soft_wrap=True)
    raise typer.Exit(code)


def show(*renderables: Any, err: bool = False) -> None:
    """Print tables and lines on stdout (stderr with `err`), never cropped to the console."""
    _console("err_console" if err else "console").print(*renderables, crop=False)


def plain(value: Any) -> str:
    """A value as literal text inside markup: brackets escaped, controls shown (`printable`)."""
    from rich.markup import escape

    return escape(printable(str(value)))


def fmt(v: Any, digits: int = 3) -> str:
    """A value in a table cell: ``-`` for none, yes/no, floats to `digits` places."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def pct(v: Any) -> str:
    """A share as a percentage, ``-`` for none."""
    return "-" if v is None else f"{100 * v:.1f}%"


def mark(ok: bool | None) -> str:
    """A yes/no/unknown word, coloured, for a line of markup."""
    return "[green]yes[/]" if ok else ("[red]no[/]" if ok is not None else "[yellow]?[/]")


def flag(ok: bool | None) -> Text:
    """A yes/no/unknown table cell, coloured."""
    from rich.text import Text

    if ok is None:
        return Text("?", style="yellow")
    return Text("yes", style="green") if ok else Text("no", style="red")


def num(v: Any) -> str:
    """A number to 3 places (tau, agreement), ``-`` when there is none."""
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"
