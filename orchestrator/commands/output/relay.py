"""How `relay --list` and a relay's report look to people. Words kept apart: a checkpoint
left out is "not complete"; bytes a destination holds are "already there"."""

from __future__ import annotations

from rich.text import Text

from orchestrator.commands.output.base import console, plain, show
from orchestrator.commands.output.tables import Col, Grid, styled
from orchestrator.printable import printable
from orchestrator.relay import run as relay_lib
from orchestrator.sizes import human_bytes


def render_checkpoints(listing: dict) -> None:
    """`relay --list`: each checkpoint, whether complete, and where it was relayed."""
    table = Grid(
        f"checkpoints on {listing['source']}:{listing['source_dir']}",
        [
            Col("name", "id"),
            Col("step", "num", justify="right"),
            Col("files", "num", justify="right", drop=1),
            Col("size", "num", justify="right"),
            Col("complete"),
            *[Col(d) for d in listing["destinations"]],
        ],
    )
    for row in listing["checkpoints"]:
        complete = (
            styled("yes", "green")
            if row["complete"]
            else Text.assemble(("no", "yellow"), f" ({printable(str(row['reason']))})")
        )
        table.row(
            row["name"],
            str(row["step"]),
            str(row["files"]),
            human_bytes(row["size"]),
            complete,
            *row["destinations"].values(),
        )
    show(table)


def render_relay_report(report: relay_lib.RelayReport) -> None:
    """`relay`: what was left out, a row per checkpoint and destination, totals, pruned;
    nothing when every checkpoint asked for is not complete (the error line says it)."""
    data = report.to_json()
    if not data["checkpoints"] and report.skipped_named:
        return
    for inc in report.incomplete:
        console.print(
            f"[yellow]not complete, left out:[/] {plain(inc['name'])}: {plain(inc['reason'])}",
            soft_wrap=True,
        )
    if not data["checkpoints"]:
        console.print("nothing to relay", soft_wrap=True)
        return
    sent = "to send" if report.dry_run else "sent"
    table = Grid(
        ("planned " if report.dry_run else "") + f"relay from {report.source}:{report.source_dir}",
        [
            Col("checkpoint", "id"),
            Col("step", "num", justify="right"),
            Col("size", "num", justify="right", drop=1),
            Col("destination", "id"),
            Col("status"),
            Col(sent, "num", justify="right"),
            Col("already there", "num", justify="right"),
        ],
    )
    for c in data["checkpoints"]:
        for host, st in c["destinations"].items():
            status = st["status"] + (f" ({', '.join(st['repaired'])})" if st["repaired"] else "")
            table.row(
                c["name"],
                str(c["step"]),
                human_bytes(c["size"]),
                host,
                status,
                human_bytes(st["bytes_planned" if report.dry_run else "bytes_sent"]),
                human_bytes(st["bytes_skipped"]),
            )
    show(table)
    rate = f", {data['mib_per_s']} MiB/s" if data["mib_per_s"] and data["bytes_read"] else ""
    console.print(
        f"{human_bytes(data['bytes_sent'])} sent, {human_bytes(data['bytes_skipped'])}"
        f" already there, {data['files_sent']} files, {data['seconds']:.1f}s{rate}",
        soft_wrap=True,
    )
    for host, names in report.pruned.items():
        if names:
            console.print(f"pruned on {plain(host)}: {plain(', '.join(names))}", soft_wrap=True)
