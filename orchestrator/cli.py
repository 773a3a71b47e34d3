"""The `dflash` command line. Parsing and printing only: the work lives in library modules."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from orchestrator.errors import DflashError

app = typer.Typer(
    name="dflash",
    help="Relay, probe and evaluate DFlash drafters across a trainer and eval hosts over SSH.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # --install-completion / --show-completion for bash, zsh, fish and PowerShell.
    add_completion=True,
    # -h everywhere: click hands help option names down to every subcommand's context.
    context_settings={"help_option_names": ["-h", "--help"]},
)

COMMAND_MODULES = (
    "orchestrator.commands.hosts",
    "orchestrator.commands.probe",
    "orchestrator.commands.remote_eval",
    "orchestrator.commands.results",
    "orchestrator.commands.relay",
    "orchestrator.commands.follow",
    "orchestrator.commands.demo",
    "orchestrator.commands.env",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)

err_console = Console(stderr=True, highlight=False)


def _print_version(value: bool) -> None:
    if value:
        from orchestrator import __version__
        typer.echo(f"dflash {__version__}")
        raise typer.Exit()


@app.callback()
def _root(accept_new_host_keys: bool = typer.Option(
        False, "--accept-new-host-keys",
        help="Trust and remember SSH host keys seen for the first time (like OpenSSH's "
             "accept-new). Changed keys are always refused."),
          version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print dflash's version and exit.")) -> None:
    from orchestrator import hosts
    hosts.ACCEPT_NEW_HOST_KEYS = accept_new_host_keys


def main() -> None:
    """Run the CLI; a `DflashError` becomes one red line on stderr and its exit code."""
    try:
        app(prog_name="dflash")  # also names the completion scripts' command
    except DflashError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
