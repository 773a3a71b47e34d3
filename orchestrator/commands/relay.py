"""`dflash relay`: move checkpoints from a trainer to eval hosts, verified and resumable."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import (
    InventoryOption,
    JsonOption,
    inventory,
    stopped_by_signal,
)
from orchestrator.relay import run as relay_lib
from orchestrator.relay.request import raise_if_incomplete, relay_request


def relay(
    ctx: typer.Context,
    checkpoints: Annotated[
        list[str] | None,
        typer.Argument(
            help="Checkpoint names to relay (default: the newest complete one).", show_default=False
        ),
    ] = None,
    source: Annotated[
        str | None, typer.Option("--from", help="Trainer host (default: defaults.relay_from).")
    ] = None,
    dest: Annotated[
        list[str] | None,
        typer.Option(
            "--to",
            help="Eval host(s) or group(s), comma-separated or repeated; each file is "
            "read once and written to all (default: defaults.relay_to).",
        ),
    ] = None,
    step: Annotated[
        int | None,
        typer.Option("--step", min=0, help="Relay the checkpoint of this training step."),
    ] = None,
    latest: Annotated[
        bool, typer.Option("--latest", help="Relay the newest complete checkpoint (the default).")
    ] = False,
    all_: Annotated[bool, typer.Option("--all", help="Relay every complete checkpoint.")] = False,
    list_: Annotated[
        bool,
        typer.Option(
            "--list",
            help="Show the source's checkpoints, "
            "whether complete, and where relayed; move nothing.",
        ),
    ] = False,
    src_dir: Annotated[
        str | None,
        typer.Option(
            "--src-dir",
            help="Checkpoint folder on the source (default: its trainer role's 'checkpoints').",
        ),
    ] = None,
    dest_dir: Annotated[
        str | None,
        typer.Option(
            "--dest-dir",
            help="Folder on the destination(s) (default: their eval role's 'drafters').",
        ),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Re-hash relayed checkpoints on the destination and repair damaged files.",
        ),
    ] = False,
    keep: Annotated[
        int | None,
        typer.Option(
            "--keep",
            min=1,
            help="Keep only the newest K relayed checkpoints on each "
            "destination (default: defaults.keep).",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            help="Streams at once; the files are split among them "
            "(default: one per two local cores, 1 to 4).",
        ),
    ] = None,
    reserve: Annotated[
        str | None,
        typer.Option(
            "--reserve",
            help="Space to leave free on the destination, e.g. 20G (default: the "
            "eval role's 'reserve', else 0).",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Plan and report; move nothing.")
    ] = False,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Relay checkpoints from the trainer to eval hosts through this machine: streamed (never
    stored here), sha256-verified on both hosts, resumable, published by one rename."""
    request = relay_request(
        inventory(ctx, inventory_path),
        source,
        dest,
        checkpoints,
        step=step,
        latest=latest,
        all_=all_,
        src_dir=src_dir,
        dest_dir=dest_dir,
        verify=verify,
        dry_run=dry_run,
        keep=keep,
        jobs=jobs,
        reserve=reserve,
    )
    if list_:
        with stopped_by_signal():
            listing = relay_lib.list_checkpoints(
                request.inventory, request.source, request.dests, request.options
            )
        output.emit(listing, json_out, human=output.render_checkpoints)
        return
    resume = ": what arrived is kept in the partial folder; rerun the same relay to resume"
    with stopped_by_signal(resume), output.relay_bar(enabled=not json_out) as bar:
        report = relay_lib.relay(
            request.inventory, request.source, request.dests, request.options, bar
        )
    output.emit(
        report,
        json_out,
        # looked up only when shown: the renderer's module imports rich, which --json skips
        human=lambda r: output.render_relay_report(r),
        as_json=relay_lib.RelayReport.to_json,
    )
    raise_if_incomplete(report)


def register(app: typer.Typer) -> None:
    app.command("relay")(relay)
