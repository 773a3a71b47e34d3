"""Options and printing helpers shared by the command modules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.errors import DflashError
from orchestrator.inventory import Inventory, load_inventory
from remote.protocol import SpecError, parse_budgets, parse_dtype

InventoryOption = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        help="Inventory file (default: $DFLASH_INVENTORY, then ./inventory.yaml).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def positive(value: float | None) -> float | None:
    """Option callback: a number that must be above 0 (Typer's `min` cannot exclude 0)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be more than 0, got {value:g}")
    return value


def _dtype(value: str | None) -> str | None:
    """bf16/fp32 become the one vocabulary of `remote.protocol`; an unknown dtype is a
    DflashError, so the CLI prints it as one line before anything connects."""
    try:
        return parse_dtype(value)
    except SpecError as exc:
        raise DflashError(str(exc)) from None


def _budgets(text: str | None) -> list[int] | None:
    """``8,16,32`` as budgets, checked before anything connects; empty: the default."""
    if not text:
        return None
    try:
        return list(parse_budgets(text, allow_empty=False))
    except SpecError as exc:
        raise DflashError(f"--{exc}") from None


DtypeOption = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        callback=_dtype,
        help="bfloat16 (or bf16) | float32 (or fp32) (default: the inventory's).",
    ),
]
BudgetsOption = Annotated[
    str | None,
    typer.Option(
        "--budgets",
        callback=_budgets,
        help="DDTree node budgets, comma-separated (default 8,16,32,64).",
    ),
]


def inventory(ctx: typer.Context, path: Path | None) -> Inventory:
    """The inventory, with the root option ``--accept-new-host-keys`` (kept in the root
    context's ``obj`` by `orchestrator.cli`) passed down to it."""
    obj = ctx.find_root().obj or {}
    return load_inventory(path, accept_new_host_keys=bool(obj.get("accept_new_host_keys")))
