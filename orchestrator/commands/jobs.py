"""`dflash jobs list | attach | cancel | prune`: the detached jobs on the inventory's hosts
(evals, parity captures and compares), whatever started them, and their hosts' workdirs."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator import jobs as hostjobs
from orchestrator.commands import output
from orchestrator.commands.common import (
    InventoryOption,
    JsonOption,
    ResultsDirOption,
    inventory,
)

jobs_app = typer.Typer(
    help="The detached jobs on the hosts: list them, attach to one, cancel one, prune the "
    "finished ones and the caches (dflash jobs alone: jobs list).",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help, as the root's (orchestrator.cli): never cut
)

JobArgument = Annotated[
    str,
    typer.Argument(
        metavar="JOB",
        help="The job's id, or a part of it that names one job, as for results (dflash jobs "
        "list shows them).",
    ),
]
HostsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        "-H",
        help="Host(s) or group(s) to ask (default: every host in the inventory: evals run "
        "on eval hosts, parity captures on either host, a trainer included).",
    ),
]
HostOption = Annotated[
    str | None,
    typer.Option("--host", "-H", help="Host the job runs on (default: defaults.eval_host)."),
]


@jobs_app.command("list")
def list_cmd(
    ctx: typer.Context,
    host: HostsOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """The jobs on the inventory's hosts (evals, parity captures and compares) with their
    state and progress."""
    rows = hostjobs.jobs_on(inventory(ctx, inventory_path), host)
    output.emit(rows, json_out, human=output.render_jobs)


@jobs_app.command("attach")
def attach_cmd(
    ctx: typer.Context,
    job: JobArgument,
    host: HostOption = None,
    results: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Watch job JOB to its end (after a dropped connection or a --detach), then pull its
    result: an eval's run, or a parity compare's."""
    inv = inventory(ctx, inventory_path)
    with output.LiveProgress(not json_out) as live:
        attached = hostjobs.attach_on(inv, host, job, on_event=live, dest=results)
    output.emit(attached, json_out, human=output.render_attached, as_json=output.attached_json)


@jobs_app.command("cancel")
def cancel_cmd(
    ctx: typer.Context,
    job: JobArgument,
    host: HostOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Stop job JOB and every process it started."""
    cancelled = hostjobs.cancel_on(inventory(ctx, inventory_path), host, job)
    output.emit(
        cancelled, json_out, human=output.render_cancelled, as_json=hostjobs.Cancelled.to_json
    )


@jobs_app.command("prune")
def prune_cmd(
    ctx: typer.Context,
    host: HostsOption = None,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Remove what was last written longer ago than this: 7d, 12h, 30m, 90s, 0.",
        ),
    ] = "7d",
    ground_truth: Annotated[
        bool,
        typer.Option(
            "--ground-truth", help="Also the ground-truth cache's entries (<workdir>/groundtruth)."
        ),
    ] = False,
    features: Annotated[
        bool,
        typer.Option(
            "--features",
            help="Also the target-feature cache's entries (<workdir>/features, up to "
            "feature_cache_gib: 16 GiB by default).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would go and its size; remove nothing.")
    ] = False,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Make room in the hosts' workdirs (~/.dflash): remove finished job folders older than
    --older-than and, when asked, the ground-truth and feature caches' entries as old.
    A running job is never touched, nor a cache while a job runs; nothing outside the
    workdir, and no symlink is followed."""
    pruned = hostjobs.prune_on(
        inventory(ctx, inventory_path),
        host,
        older_than,
        ground_truth=ground_truth,
        features=features,
        dry_run=dry_run,
    )
    output.emit(pruned, json_out, human=output.render_pruned, as_json=output.pruned_json)


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")
