"""`dflash env`: versions and the inventory in use, for bug reports."""

from __future__ import annotations

import typer

from orchestrator.commands.common import InventoryOption, JsonOption
from orchestrator.commands.output import console, print_json
from orchestrator.environment import environment


def env_cmd(inventory_path: InventoryOption = None, json_out: JsonOption = False) -> None:
    """Print dflash, python, torch, transformers, paramiko, fabric and OpenSSH versions and
    which inventory was found, and from where (paste it into a bug report)."""
    info = environment(str(inventory_path) if inventory_path else None)
    if json_out:
        print_json(info)
        return
    rows = [
        ("dflash", f"{info['dflash']} ({info['dflash_path']})"),
        (
            "python",
            f"{info['python']} ({info['python_executable']}{', venv' if info['in_venv'] else ''})",
        ),
        ("platform", info["platform"]),
    ]
    rows += [(name, version or "not installed") for name, version in info["packages"].items()]
    rows.append(("openssh", info["openssh"] or "not installed"))
    inv = info["inventory"]
    rows.append(
        (
            "inventory",
            f"{inv['path']} (from {inv['from']}{'' if inv['exists'] else '; no such file'})",
        )
    )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        console.print(f"{key:<{width}}  {value}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("env")(env_cmd)
