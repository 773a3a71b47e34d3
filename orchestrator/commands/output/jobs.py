"""How jobs look to people: listed, cancelled, started detached, attached, pruned."""

from __future__ import annotations

from orchestrator.commands.output.base import console, plain, show
from orchestrator.commands.output.tables import Col, Grid, styled
from orchestrator.sizes import human_age, human_bytes
from remote.protocol import JobKind, JobState

JOB_COLOURS = {
    JobState.STARTING: "white",
    JobState.RUNNING: "cyan",
    JobState.DONE: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "yellow",
    JobState.LOST: "red",
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
        if r["state"] == JobState.DONE:
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


def render_cancelled(cancelled) -> None:
    """`jobs cancel`: what the job was and how many of its processes were stopped."""
    out = cancelled.answer
    console.print(
        plain(
            f"job {cancelled.job_id} on {cancelled.host}: {out['state']} (was {out['was']}; "
            f"{out['killed']} process(es) stopped)"
        ),
        soft_wrap=True,
    )


def render_started(ref) -> None:
    """`remote-eval --detach`: the job started and how to watch it."""
    console.print(
        plain(
            f"started job {ref.job_id} on {ref.host} (pid {ref.pid}); watch with: "
            f"dflash jobs attach {ref.job_id} --host {ref.host}"
        ),
        soft_wrap=True,
    )


def render_attached(attached) -> None:
    """`jobs attach`: the pulled run, as its kind shows it."""
    if attached.kind == JobKind.COMPARE:
        from orchestrator.commands.output.parity import render_parity_run

        render_parity_run(attached.run_dir)
    elif attached.kind == JobKind.ONLINE:
        from orchestrator.commands.output.online import render_online_run

        render_online_run(attached.run_dir)
    else:
        from orchestrator.commands.output.results import render_eval_run
        from orchestrator.results.store import load_run

        render_eval_run(load_run(attached.run_dir))


def attached_json(attached) -> dict:
    """`jobs attach --json`: as `remote-eval --json` or `parity_attach_json` gives it."""
    if attached.kind == JobKind.COMPARE:
        from orchestrator.commands.output.parity import parity_attach_json

        return parity_attach_json(attached.run_dir)
    if attached.kind == JobKind.ONLINE:
        from orchestrator.commands.output.online import online_json

        return online_json(attached.run_dir)
    from orchestrator.commands.output.results import eval_run_json
    from orchestrator.results.store import load_run

    return eval_run_json(load_run(attached.run_dir))


def render_pruned(pruned: list) -> None:
    """`jobs prune`: what went (or would), per host what stayed and why, the total."""
    dry = any(p.answer["dry_run"] for p in pruned)
    table = Grid(
        "would remove" if dry else "removed",
        [
            Col("host", "id"),
            Col("what", "id"),
            Col("size", "num", justify="right"),
            Col("age", "num", justify="right"),
            Col("state", "id", drop=1),
            Col("path"),
        ],
    )
    for p in pruned:
        for e in p.answer["entries"]:
            state = e.get("state")
            table.row(
                p.host,
                e["area"],
                human_bytes(e["bytes"]),
                human_age(e["age"]),
                styled(state, JOB_COLOURS.get(state, "white")) if state else "-",
                e["path"],
            )
    if table.rows:
        show(table)
    for p in pruned:
        for s in p.answer["skipped"]:
            kept = f"{p.host}: {s['path']}: {s['why']}"
            console.print(f"[yellow]kept:[/] {plain(kept)}", soft_wrap=True)
        entries = p.answer["entries"]
        total = human_bytes(sum(e["bytes"] for e in entries))
        verb = "would remove" if p.answer["dry_run"] else "removed"
        console.print(
            plain(f"{p.host}: {verb} {len(entries)} item(s), {total} ({p.answer['workdir']})"),
            soft_wrap=True,
        )


def pruned_json(pruned: list) -> list[dict]:
    return [p.to_json() for p in pruned]
