"""`dflash probe-structure`: a model's real shape on a host, as a tree or JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import InventoryOption, JsonOption, inventory
from orchestrator.eval.run import eval_host_name
from orchestrator.probe.structure import DEFAULT_DEPTH, probe_failed, probe_on


def probe_command(
    ctx: typer.Context,
    host: Annotated[
        str | None,
        typer.Option("--host", "-H", help="Host to probe on (default: defaults.eval_host)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Model folder on the host (default: the host's eval target_model)."
        ),
    ] = None,
    drafter: Annotated[
        str | None,
        typer.Option(
            "--drafter",
            help="DFlash drafter checkpoint to check against the model: a name under the "
            "host's 'drafters' folder, or an absolute path there (as remote-eval --checkpoint).",
        ),
    ] = None,
    load: Annotated[
        bool,
        typer.Option(
            "--load", help="Load the text backbone and verify hidden states (reads weights)."
        ),
    ] = False,
    depth: Annotated[
        int, typer.Option("--depth", min=0, help="Module tree depth.")
    ] = DEFAULT_DEPTH,
    json_out: JsonOption = False,
    inventory_path: InventoryOption = None,
) -> None:
    """What is this model, really? Classes, layer paths, layer kinds, sizes, keys, fit."""
    inv = inventory(ctx, inventory_path)
    name = eval_host_name(inv, host)
    report = probe_on(inv, name, model, drafter=drafter, load=load, depth=depth)
    output.emit(report, json_out, human=lambda r: output.render_probe(r, name))
    if probe_failed(report):  # the tree or the JSON says what
        output.exit_with(1)


def register(app: typer.Typer) -> None:
    app.command("probe-structure")(probe_command)
