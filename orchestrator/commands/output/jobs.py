"""How eval jobs look to people: the jobs on eval hosts, a job cancelled, a job started
detached."""

from __future__ import annotations

from orchestrator.commands.output.base import console, plain, show
from orchestrator.commands.output.tables import Col, Grid, styled

JOB_COLOURS = {
    "running": "cyan",
    "done": "green",
    "failed": "red",
    "cancelled": "yellow",
    "lost": "red",
}


def render_jobs(rows: list[dict]) -> None:
    """`jobs`: one row per job, its state coloured, its progress in words."""
    table = Grid(
        "jobs",
        [
            Col("host", "id"),
            Col("job", "id"),
            Col("state", "id"),
            Col("checkpoint"),
            Col("progress"),
            Col("error", drop=1),
        ],
    )
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
        table.row(
            r["host"],
            r["job_id"],
            styled(r["state"], JOB_COLOURS.get(r["state"], "white")),
            r.get("checkpoint") or "-",
            prog,
            (r.get("exit") or {}).get("error") or "",
        )
    show(table)


def render_cancelled(out: dict, job_id: str, host: str, processes: bool = True) -> None:
    """`remote-eval --cancel` / `parity --cancel`: what the job was (and, for an eval job,
    how many processes were stopped)."""
    killed = f"; {out['killed']} process(es) stopped" if processes else ""
    console.print(
        plain(f"job {job_id} on {host}: {out['state']} (was {out['was']}{killed})"), soft_wrap=True
    )


def render_started(ref) -> None:
    """`remote-eval --detach`: the job started and how to watch it."""
    console.print(
        plain(
            f"started job {ref.job_id} on {ref.host} (pid {ref.pid}); watch with: "
            f"dflash remote-eval --attach {ref.job_id}"
        ),
        soft_wrap=True,
    )
