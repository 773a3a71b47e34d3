"""`dflash jobs list | attach | cancel`: the detached jobs on the inventory's hosts (evals,
parity captures and compares), whatever started them."""

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
    help="The detached jobs on the hosts: list them, attach to one, cancel one "
    "(dflash jobs alone: jobs list).",
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
HostOption = Annotated[
    str | None,
    typer.Option("--host", "-H", help="Host the job runs on (default: defaults.eval_host)."),
]


@jobs_app.command("list")
def list_cmd(
    ctx: typer.Context,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            "-H",
            help="Host(s) or group(s) to ask (default: every host in the inventory: evals run "
            "on eval hosts, parity captures on either host, a trainer included).",
        ),
    ] = None,
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


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")
