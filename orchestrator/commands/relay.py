"""`dflash relay`: move checkpoints from a trainer to eval hosts, verified and resumable."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.table import Table

from orchestrator.commands.common import InventoryOption, JsonOption, inventory
from orchestrator.commands.output import RelayProgress, console, err_console, print_json
from orchestrator.errors import DflashError
from orchestrator.relay import run as relay_lib
from orchestrator.sizes import human_bytes, parse_size


class _Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so the relay ends its streams and masters."""


@contextmanager
def _sigterm_as_interrupt():
    """While inside, SIGTERM raises `_Terminated` (a KeyboardInterrupt): the relay stops
    the same way as on Ctrl-C, and the command says so instead of dying silently."""

    def handler(signum, frame):
        raise _Terminated()

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (embedded use): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _split(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]


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
    inv = inventory(ctx, inventory_path)
    src = source or inv.defaults.relay_from
    dests = _split(dest) or _split([inv.defaults.relay_to] if inv.defaults.relay_to else [])
    if not src:
        raise DflashError("no source: pass --from HOST or set defaults.relay_from in the inventory")
    if sum(bool(x) for x in (checkpoints, step is not None, latest, all_)) > 1:
        raise DflashError("choose one of CHECKPOINT names, --step, --latest or --all")
    options = relay_lib.RelayOptions(
        names=list(checkpoints or []),
        step=step,
        latest=latest,
        all=all_,
        src_dir=src_dir,
        dest_dir=dest_dir,
        verify=verify,
        dry_run=dry_run,
        keep=keep if keep is not None else inv.defaults.keep,
        jobs=jobs,
        reserve=parse_size(reserve) if reserve is not None else None,
    )
    if list_:
        try:
            with _sigterm_as_interrupt():
                listing = relay_lib.list_checkpoints(inv, src, dests, options)
        except KeyboardInterrupt as exc:
            err_console.print(
                "[yellow]terminated[/]"
                if isinstance(exc, _Terminated)
                else "[yellow]interrupted[/]"
            )
            raise typer.Exit(143 if isinstance(exc, _Terminated) else 130) from None
        if json_out:
            print_json(listing)
            return
        table = Table(title=f"checkpoints on {listing['source']}:{listing['source_dir']}")
        for col in ("name", "step", "files", "size", "complete", *listing["destinations"]):
            table.add_column(col)
        for row in listing["checkpoints"]:
            table.add_row(
                row["name"],
                str(row["step"]),
                str(row["files"]),
                human_bytes(row["size"]),
                "[green]yes[/]" if row["complete"] else f"[yellow]no[/] ({row['reason']})",
                *row["destinations"].values(),
            )
        console.print(table)
        return
    bar = None if json_out else RelayProgress()
    try:
        with _sigterm_as_interrupt():
            report = relay_lib.relay(inv, src, dests, options, bar)
    except KeyboardInterrupt as exc:
        # Click would swallow it silently; say what happened and what to do.
        if bar:
            bar.stop()
        term = isinstance(exc, _Terminated)
        err_console.print(
            f"[yellow]{'terminated' if term else 'interrupted'}[/]: what "
            "arrived is kept in the partial folder; rerun the same relay to "
            "resume",
            soft_wrap=True,
        )
        raise typer.Exit(143 if term else 130) from None
    finally:
        if bar:
            bar.stop()
    if json_out:
        print_json(report.to_json())
    else:
        _print_report(report)
    if report.skipped_named and not report.failures:
        first = report.skipped_named[0]
        more = (
            f" (and {len(report.skipped_named) - 1} more)" if len(report.skipped_named) > 1 else ""
        )
        raise relay_lib.RelayIncomplete(f"{first['name']} was not relayed: {first['reason']}{more}")
    if not report.ok:
        name, host, error = report.failures[0]
        more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
        raise relay_lib.RelayIncomplete(
            f"relay of {name} to {host} failed: {error}{more}; rerun to resume from what arrived"
        )


def _print_report(report: relay_lib.RelayReport) -> None:
    data = report.to_json()
    for inc in report.incomplete:
        console.print(f"[yellow]skipped[/] {inc['name']}: {inc['reason']}")
    table = Table(
        title=("planned " if report.dry_run else "")
        + f"relay from {report.source}:{report.source_dir}"
    )
    sent = "to send" if report.dry_run else "sent"
    for col in ("checkpoint", "step", "size", "destination", "status", sent, "skipped"):
        table.add_column(col)
    for c in data["checkpoints"]:
        for host, st in c["destinations"].items():
            status = st["status"] + (f" ({', '.join(st['repaired'])})" if st["repaired"] else "")
            table.add_row(
                c["name"],
                str(c["step"]),
                human_bytes(c["size"]),
                host,
                status,
                human_bytes(st["bytes_planned" if report.dry_run else "bytes_sent"]),
                human_bytes(st["bytes_skipped"]),
            )
    console.print(table)
    rate = f", {data['mib_per_s']} MiB/s" if data["mib_per_s"] and data["bytes_read"] else ""
    console.print(
        f"{human_bytes(data['bytes_sent'])} sent, {human_bytes(data['bytes_skipped'])}"
        f" already there, {data['files_sent']} files, {data['seconds']:.1f}s{rate}"
    )
    for host, names in report.pruned.items():
        if names:
            console.print(f"pruned on {host}: {', '.join(names)}")


def register(app: typer.Typer) -> None:
    app.command("relay")(relay)
