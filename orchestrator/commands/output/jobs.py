"""How eval jobs look to people: the jobs on eval hosts, a job cancelled, a job started
detached."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from orchestrator.commands.output.base import console

JOB_COLOURS = {
    "running": "cyan",
    "done": "green",
    "failed": "red",
    "cancelled": "yellow",
    "lost": "red",
}


def render_jobs(rows: list[dict]) -> None:
    """`jobs`: one row per job, its state coloured, its progress in words."""
    table = Table(title="jobs")
    for col in ("host", "job", "state", "checkpoint", "progress", "error"):
        table.add_column(col)
    for r in rows:
        p = r.get("progress") or {}
        if r["state"] == "done":
            prog = "result ready" if r.get("has_result") else "finished"
        elif p.get("event") == "sample":
            prog = f"eval {p.get('done')}/{p.get('total')}"
        elif p.get("event") == "ground_truth":
            prog = f"ground truth {p.get('done')}/{p.get('total')}"
        else:
            prog = p.get("phase") or p.get("event") or "-"
        c = JOB_COLOURS.get(r["state"], "white")
        # what a host says is text, never markup: a "[/]" in it would stop the table
        table.add_row(
            escape(r["host"]),
            r["job_id"],
            f"[{c}]{r['state']}[/]",
            escape(r.get("checkpoint") or "-"),
            escape(str(prog)),
            escape(((r.get("exit") or {}).get("error") or "")[:80]),
        )
    console.print(table)


def render_cancelled(out: dict, job_id: str, host: str, processes: bool = True) -> None:
    """`remote-eval --cancel` / `parity --cancel`: what the job was (and, for an eval job,
    how many processes were stopped)."""
    killed = f"; {out['killed']} process(es) stopped" if processes else ""
    console.print(f"job {job_id} on {host}: {out['state']} (was {out['was']}{killed})")


def render_started(ref) -> None:
    """`remote-eval --detach`: the job started and how to watch it."""
    console.print(
        f"started job {ref.job_id} on {ref.host} (pid {ref.pid}); watch with: "
        f"dflash remote-eval --attach {ref.job_id}"
    )
