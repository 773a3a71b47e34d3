"""`dflash demo`: the whole relay -> probe -> eval loop on this machine, with tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.commands.common import JsonOption
from orchestrator.commands.output import RichEvents, console, history_table, print_json


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
    json_out: JsonOption = False,
) -> None:
    """The whole loop on this machine with tiny models (about 1-3 minutes).

    A tiny Qwen3.5-VL target, a tiny DFlash drafter trained on it (checkpoints at several
    steps), two local hosts and a ground-truth server; relay,
    probe-structure and remote-eval each checkpoint; print tau per step and the plot."""
    from orchestrator.demo.run import DemoOptions, run_demo

    events = RichEvents(enabled=not json_out)
    try:
        result = run_demo(DemoOptions(fresh=fresh, keep_dir=keep_dir), events)
    finally:
        events.close()
    if json_out:
        print_json(result.to_json())
        return
    console.print(history_table(result.history, "demo: tau per checkpoint step"))
    secs = result.seconds
    console.print(f"plot: {result.plot}", soft_wrap=True)
    console.print(f"results: {result.results_dir}", soft_wrap=True)
    if result.folder:
        console.print(f"demo folder (kept): {result.folder}", soft_wrap=True)
    console.print(
        f"models: {result.models} ({'built now' if result.built_now else 'cached'})"
        f"; {secs['total']:.0f}s in all: models {secs['models']:.0f}s, setup "
        f"{secs['setup']:.0f}s, relay+probe+eval {secs['relay_probe_eval']:.0f}s",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
