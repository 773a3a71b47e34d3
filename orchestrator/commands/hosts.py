"""`dflash hosts` and `dflash hosts check`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from orchestrator.commands.common import InventoryOption, JsonOption, inventory
from orchestrator.commands.output import console, err_console, print_json
from orchestrator.probe.facts import check_hosts
from orchestrator.sizes import human_bytes

hosts_app = typer.Typer(
    help="List the inventory's hosts, or check what they are.",
    no_args_is_help=False,
    invoke_without_command=True,
)


@hosts_app.callback()
def list_hosts(
    ctx: typer.Context, inventory_path: InventoryOption = None, json_out: JsonOption = False
) -> None:
    """List the inventory's hosts, their transport, address and roles."""
    if ctx.invoked_subcommand is not None:
        return
    inv = inventory(ctx, inventory_path)
    rows = []
    for spec in inv.hosts.values():
        roles = [r for r in ("trainer", "eval") if getattr(spec, r)]
        address = (
            "local"
            if spec.transport == "local"
            else (
                f"{spec.user + '@' if spec.user else ''}{spec.hostname or spec.name}"
                f"{':' + str(spec.port) if spec.port else ''}"
            )
        )
        rows.append(
            {
                "name": spec.name,
                "transport": spec.transport,
                "address": address,
                "jump": spec.jump,
                "roles": roles,
                "python": spec.python,
                "workdir": spec.workdir,
            }
        )
    if json_out:
        print_json({"inventory": str(inv.path), "hosts": rows, "groups": inv.groups})
        return
    table = Table(title=f"hosts in {inv.path}")
    for col in ("name", "transport", "address", "roles", "python", "workdir"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"],
            r["transport"],
            r["address"] + (f" via {r['jump']}" if r["jump"] else ""),
            ", ".join(r["roles"]) or "-",
            r["python"],
            r["workdir"],
        )
    console.print(table)


@hosts_app.command("check")
def check(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None, typer.Argument(help="Hosts or groups to check (default: all).")
    ] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Reach each host in parallel and report OS, CPUs, memory, disk, python and ML packages."""
    inv = inventory(ctx, inventory_path)
    results = check_hosts(inv, names)
    if json_out:
        print_json([r.to_json() for r in results])
    else:
        console.print(check_table(results))
    for r in results:
        if not r.ok:
            err_console.print(f"[bold red]error:[/] {r.error}", soft_wrap=True)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


PACKAGES = ("torch", "transformers", "safetensors", "fla")


def check_table(results: list) -> Table:
    """One row per host, fitting 100 columns: the ML packages share one column, one
    line each."""
    table = Table(
        title="host check",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )
    for col in ("host", "ok", "os", "cpus", "ram avail/total", "disk free", "python", "packages"):
        table.add_column(
            col, justify="right" if col in ("cpus", "disk free") else "left", overflow="fold"
        )
    for r in results:
        if not r.ok:
            table.add_row(r.host, "[red]no[/]", *["-"] * 6)
            continue
        f = r.facts
        pk = f["packages"]
        table.add_row(
            r.host,
            "[green]yes[/]",
            f["os"],
            str(f["cpus"]),
            f"{human_bytes(f['memory']['available'])} / {human_bytes(f['memory']['total'])}",
            human_bytes(f["disk_free"]),
            f["python"],
            "\n".join(f"{k} {pk.get(k) or '[yellow]missing[/]'}" for k in PACKAGES),
        )
    return table


def register(app: typer.Typer) -> None:
    app.add_typer(hosts_app, name="hosts")
