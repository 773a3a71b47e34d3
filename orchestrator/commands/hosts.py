"""`dflash hosts` and `dflash hosts check`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import InventoryOption, JsonOption, inventory
from orchestrator.probe.facts import check_hosts

hosts_app = typer.Typer(
    help="List the inventory's hosts, or check what they are.",
    no_args_is_help=False,
    invoke_without_command=True,
    rich_markup_mode=None,  # plain help, as the root's (orchestrator.cli): never cut
)


@hosts_app.callback()
def list_hosts(
    ctx: typer.Context, inventory_path: InventoryOption = None, json_out: JsonOption = False
) -> None:
    """List the inventory's hosts, their transport, address and roles."""
    if ctx.invoked_subcommand is not None:
        return
    output.emit(inventory(ctx, inventory_path).listing(), json_out, human=output.render_hosts)


@hosts_app.command("check")
def check(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None, typer.Argument(help="Hosts or groups to check (default: all).")
    ] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Reach each host in parallel and report OS, CPUs, memory, disk, python and the packages
    its roles need (an eval host: torch, transformers, safetensors; a trainer's relay:
    python3's standard library only); a host that lacks one is an error line."""
    results = check_hosts(inventory(ctx, inventory_path), names)
    output.emit(results, json_out, human=output.render_check, as_json=output.check_json)
    failed = [output.error_line(r.problem) for r in results if r.problem]
    if failed:
        output.exit_with(1, *failed)


def register(app: typer.Typer) -> None:
    app.add_typer(hosts_app, name="hosts")
