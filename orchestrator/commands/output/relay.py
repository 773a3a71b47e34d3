"""How the relay looks to people: the source's checkpoints (`relay --list`) and a relay's
report. ``--json`` prints the listing as it is and the report's ``to_json()``."""

from __future__ import annotations

from rich.table import Table

from orchestrator.commands.output.base import console
from orchestrator.relay import run as relay_lib
from orchestrator.sizes import human_bytes


def render_checkpoints(listing: dict) -> None:
    """`relay --list`: each checkpoint, whether complete, and where it was relayed."""
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


def render_relay_report(report: relay_lib.RelayReport) -> None:
    """`relay`: what was skipped, a row per checkpoint and destination, the totals, and
    what was pruned."""
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
