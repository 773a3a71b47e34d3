"""The `dflash` command line. Parsing and printing only: the work lives in library modules."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

from orchestrator.commands import output
from orchestrator.errors import DflashError

if TYPE_CHECKING:
    from typer._click import Command, HelpFormatter

# `dflash --help` lists the commands in the order a newcomer uses them.
COMMAND_ORDER = (
    "hosts",
    "relay",
    "probe-structure",
    "remote-eval",
    "jobs",
    "results",
    "follow",
    "parity",
    "online",
    "env",
    "demo",
)


DEFAULT_SUBCOMMANDS = {"jobs": "list"}


def hoist(args: list[str], flags: Collection[str]) -> list[str]:
    """`args` with the root's `flags` moved before the command: a hint's flag may end the line."""
    end = args.index("--") if "--" in args else len(args)
    head = args[:end]
    return [a for a in head if a in flags] + [a for a in head if a not in flags] + args[end:]


def with_default_subcommand(args: list[str]) -> list[str]:
    """`args` with a group's default subcommand put in when none is named."""
    at = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if at is None:
        return args
    command, rest = args[at], args[at + 1 :]
    default = DEFAULT_SUBCOMMANDS.get(command)
    if default and (not rest or (rest[0].startswith("-") and rest[0] not in ("-h", "--help"))):
        return [*args[:at], command, default, *rest]
    return args


class _Group(TyperGroup):
    """The root command: ordered commands, hoisted flags, default subcommands, tidy help."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, with_default_subcommand(hoist(args, self.flags(ctx))))

    def flags(self, ctx: typer.Context) -> set[str]:
        """The root's flags that may follow the command: all but the eager ones."""
        return {
            name
            for p in self.get_params(ctx)
            if getattr(p, "is_flag", False) and not p.is_eager
            for name in p.opts
        }

    def list_commands(self, ctx: typer.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(super().list_commands(ctx), key=lambda n: rank.get(n, len(rank)))

    def get_command(self, ctx: typer.Context, name: str) -> Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            _tidy(command, ctx)
        return command

    def format_help(self, ctx: typer.Context, formatter: HelpFormatter) -> None:
        _tidy(self, ctx)
        super().format_help(ctx, formatter)


def _tidy(command: Command, ctx: typer.Context) -> None:
    """Help as written: no ``<bool>`` after a flag, no breaks in a paragraph. Idempotent."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    if command.help:
        paragraphs = command.help.split("\n\n")
        command.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub, ctx)


_app = typer.Typer(
    name="dflash",
    cls=_Group,
    help="Relay, probe and evaluate DFlash drafters across a trainer and eval hosts over SSH.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's formatter wraps option names at any width, where rich's panels cut them.
    rich_markup_mode=None,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

COMMAND_MODULES = (
    "orchestrator.commands.hosts",
    "orchestrator.commands.probe",
    "orchestrator.commands.remote_eval",
    "orchestrator.commands.online",
    "orchestrator.commands.jobs",
    "orchestrator.commands.results",
    "orchestrator.commands.relay",
    "orchestrator.commands.follow",
    "orchestrator.commands.demo",
    "orchestrator.commands.env",
    "orchestrator.commands.parity",
)

_loaded: set[str] = set()


def _load(modules: tuple[str, ...]) -> typer.Typer:
    """Register the commands of `modules` not registered yet; the app."""
    for name in modules:
        if name not in _loaded:
            _loaded.add(name)
            importlib.import_module(name).register(_app)
    return _app


def _modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules `argv` needs: the one named like the command, else all."""
    words = [a for a in argv if not a.startswith("-")]
    completing = any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)
    if words and not completing:
        module = "orchestrator.commands." + words[0].replace("-", "_")
        if module in COMMAND_MODULES:
            return (module,)
    return COMMAND_MODULES


def __getattr__(name: str):
    """``app``: the Typer app with every command registered (for tests and embedding)."""
    if name == "app":
        return _load(COMMAND_MODULES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _print_version(value: bool) -> None:
    if value:
        from orchestrator import __version__

        typer.echo(f"dflash {__version__}")
        raise typer.Exit()


@_app.callback()
def _root(
    ctx: typer.Context,
    accept_new_host_keys: bool = typer.Option(
        False,
        "--accept-new-host-keys",
        help="Trust and remember SSH host keys seen for the first time (like OpenSSH's "
        "accept-new). Changed keys are always refused. Also taken after the command.",
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print dflash's version and exit.",
    ),
) -> None:
    # Passed down to every inventory a command loads (`commands.common.inventory`).
    ctx.obj = {"accept_new_host_keys": accept_new_host_keys}


def _usage_error(exc: BaseException) -> bool:
    """Whether `exc` is click's parse error, by class name (click's or Typer's vendored copy)."""
    return any(c.__name__ == "ClickException" for c in type(exc).__mro__)


def _run_app() -> int:
    """Run the app; a parse error is one line on stderr, not click's usage block."""
    app = _load(_modules_for(with_default_subcommand(sys.argv[1:])))
    try:
        code = app(standalone_mode=False, prog_name="dflash")
    except typer.Abort:
        output.err_console.print("[yellow]aborted[/]")
        return 1
    except Exception as exc:
        if not _usage_error(exc):
            raise
        message = exc.format_message().strip()
        if type(exc).__name__ == "NoArgsIsHelpError":
            if message:
                output.err_console.print(message, markup=False, highlight=False)
            return exc.exit_code
        ctx = getattr(exc, "ctx", None)
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        output.err_console.print(output.error_line(message + hint), soft_wrap=True)
        return exc.exit_code
    return code if isinstance(code, int) else 0


def main() -> None:
    """Run the CLI; a `DflashError` becomes one red line on stderr and its exit code."""
    try:
        code = _run_app()
    except DflashError as exc:
        output.err_console.print(output.error_line(str(exc)), soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        output.err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    sys.exit(code)
