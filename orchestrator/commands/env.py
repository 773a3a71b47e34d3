"""`dflash env`: versions and the inventory in use, for bug reports."""

from __future__ import annotations

import typer

from orchestrator.commands import output
from orchestrator.commands.common import InventoryOption, JsonOption
from orchestrator.environment import environment


def env_cmd(inventory_path: InventoryOption = None, json_out: JsonOption = False) -> None:
    """Print dflash, python, torch, transformers, paramiko, fabric and OpenSSH versions and
    which inventory was found, and from where (paste it into a bug report)."""
    info = environment(str(inventory_path) if inventory_path else None)
    output.emit(info, json_out, human=output.render_env)


def register(app: typer.Typer) -> None:
    app.command("env")(env_cmd)
