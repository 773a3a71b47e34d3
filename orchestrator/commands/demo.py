"""`dflash demo`: the whole relay -> probe -> eval loop on this machine, with tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import JsonOption


def demo_cmd(
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Rebuild the cached demo models first.")
    ] = False,
    keep_dir: Annotated[
        Path | None,
        typer.Option(
            "--keep-dir",
            help="Build the demo in this (new or empty) folder and leave it there: "
            "inventory, both hosts' folders, jobs, results.",
        ),
    ] = None,
    setup_seconds: Annotated[
        float | None,
        typer.Option(
            "--setup-seconds",
            hidden=True,
            min=0,
            help="How long scripts/demo.sh's set-up took, printed with the demo's times.",
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """The whole loop on this machine with tiny models (about 1-3 minutes).

    A tiny Qwen3.5-VL target, a tiny DFlash drafter trained on it (checkpoints at several
    steps), two local hosts and a ground-truth server; relay,
    probe-structure and remote-eval each checkpoint; print tau per step and the plot."""
    from orchestrator.demo.run import DemoOptions, DemoResult, run_demo

    with output.RichEvents(enabled=not json_out) as events:
        options = DemoOptions(fresh=fresh, keep_dir=keep_dir, setup_seconds=setup_seconds)
        result = run_demo(options, events)
    output.emit(result, json_out, human=output.render_demo, as_json=DemoResult.to_json)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
