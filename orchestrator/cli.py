"""The `dflash` command line. Parsing and printing only: the work lives in library modules."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from orchestrator.errors import DflashError

app = typer.Typer(
    name="dflash",
    help="Relay, probe and evaluate DFlash drafters across a trainer and eval hosts over SSH.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

COMMAND_MODULES = (
    "orchestrator.commands.hosts",
    "orchestrator.commands.probe",
    "orchestrator.commands.remote_eval",
    "orchestrator.commands.results",
    "orchestrator.commands.relay",
    "orchestrator.commands.follow",
    "orchestrator.commands.demo",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)

err_console = Console(stderr=True, highlight=False)


@app.callback()
def _root(accept_new_host_keys: bool = typer.Option(
        False, "--accept-new-host-keys",
        help="Trust and remember SSH host keys seen for the first time (like OpenSSH's "
             "accept-new). Changed keys are always refused.")) -> None:
    from orchestrator import hosts
    hosts.ACCEPT_NEW_HOST_KEYS = accept_new_host_keys


def main() -> None:
    """Run the CLI; a `DflashError` becomes one red line on stderr and its exit code."""
    try:
        app()
    except DflashError as exc:
        # Escaped: a message may hold brackets (pip extras, paths) that are not markup.
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
