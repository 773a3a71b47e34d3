"""The consoles, JSON for scripts, the one choice between JSON and the human view, the one
way a command ends on a failure it has explained, `show` (what prints tables, never
cropped), and the small cell helpers (tables themselves: `tables`)."""

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

# `console` (stdout) and `err_console` (stderr) are made on first use (PEP 562), and rich
# imported then: about 30 ms of every CLI start on the 2-core test box, which a --json
# run that prints no markup (an unchanged relay, a script's follow loop) never needs.
_consoles: dict[str, Console] = {}
_consoles_lock = threading.Lock()


def _console(name: str) -> Console:
    with _consoles_lock:
        if not _consoles:
            from rich.console import Console

            for key, stderr in (("console", False), ("err_console", True)):
                made = Console(stderr=stderr, highlight=False)
                # Unpinned, the width follows COLUMNS and the terminal at each print, so
                # commands invoked in one process (tests, a notebook) each get their own.
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
    """Show a command's `result`: with ``--json`` as JSON on stdout (``as_json(result)``,
    else `result` itself), otherwise through the `human` renderer. The one place that
    decides between the two, so no command branches on ``--json``."""
    if json_out:
        print_json(as_json(result) if as_json is not None else result)
    else:
        human(result)


def error_line(message: str) -> str:
    """A failure as the CLI words it everywhere: a red ``error:`` and the message, as
    literal text (it may hold names with brackets, line breaks or undecodable bytes)."""
    return f"[bold red]error:[/] {plain(message)}"


def notes(lines: list[str]) -> None:
    """What the library says about how it will run (a default it took), one yellow
    ``note:`` line each on stderr, so ``--json`` output stays clean."""
    for line in lines:
        _console("err_console").print(f"[yellow]note:[/] {plain(line)}", soft_wrap=True)


def exit_with(code: int, *lines: str) -> NoReturn:
    """End the command with exit `code` after printing `lines` (rich markup) on stderr: for
    outcomes already shown on stdout (a host that did not answer, a probe that found a
    problem, an interrupted relay). Errors that stop a command before it shows anything are
    raised as `DflashError` instead and printed by `orchestrator.cli.main`."""
    for line in lines:
        _console("err_console").print(line, soft_wrap=True)
    raise typer.Exit(code)


def show(*renderables: Any, err: bool = False) -> None:
    """Print tables (`tables.Grid`) and lines on stdout (stderr with `err`), never cropped
    to the console's width: a table whose ids and numbers cannot fit is printed whole,
    wider than the terminal, rather than cut."""
    _console("err_console" if err else "console").print(*renderables, crop=False)


def plain(value: Any) -> str:
    """A value (a name, a path, a host's words) as literal text inside a line of markup:
    brackets escaped, control characters and lone surrogates shown (`printable`)."""
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
