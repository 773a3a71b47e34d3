"""How eval results look to people: a run's summary and full view, the list of runs, a
comparison, tau per checkpoint step (follow, demo), parity, and the jobs on eval hosts.
Each ``render_*`` prints one command's result; each ``*_json`` is its ``--json`` form
when that is not the result itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from orchestrator.commands.output.base import compact, console, fmt, num, pct
from orchestrator.commands.output.parity import render_parity
from orchestrator.eval import follow as follow_lib
from orchestrator.results import catalog, parity_view
from orchestrator.results import compare as cmp
from orchestrator.results import store as res

# Keys whose numbers are Unix times: shown as dates.
TIME_KEYS = {"generated", "created", "pulled", "time", "started", "finished", "made"}


# ---- one eval run ---------------------------------------------------------------------------


def render_summary(run: res.Run) -> None:
    """The headline table of one run (also printed at the end of `remote-eval`)."""
    s = res.summary(run)
    table = Table(title=f"{s['checkpoint']}  ({s['run_id']})", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", overflow="fold")  # a sha256 wraps, never cut
    table.add_row("tau (z-lab: mean of per-sample means)", fmt(s["tau"]))
    table.add_row("tau (token-weighted: tokens / rounds)", fmt(s["tau_tokens"]))
    for b, v in s["ddtree"].items():
        table.add_row(f"DDTree-{b} tau", fmt(v))
    table.add_row("target agreement", pct(s["target_agreement"]))
    table.add_row(
        "training run",
        f"{run.training_run.name} ({run.training_run.host}:{run.training_run.folder})",
    )
    table.add_row("step", fmt(s["step"]))
    table.add_row("drafter sha256", fmt(s["drafter_sha256"]))
    table.add_row("evaluated", s["created_time"])
    table.add_row(
        "samples / tokens / rounds",
        f"{fmt(s['samples'])} / {fmt(s['tokens'])} / {fmt(s['rounds'])}",
    )
    gt = res.ground_truth_source(run)
    src = gt.get("kind") or "-"
    if gt.get("url"):
        src += f" {gt['url']}"
    if gt.get("cached"):
        src += " (cached on host)"
    table.add_row("ground truth", src)
    if s["retokenisation_mismatch"] is not None:
        table.add_row("retokenisation mismatch", f"[yellow]{pct(s['retokenisation_mismatch'])}[/]")
    console.print(table)
    for w in gt.get("warnings") or []:
        console.print(f"[bold yellow]warning:[/] {w}", soft_wrap=True)


def eval_run_json(run: res.Run) -> dict:
    """What `remote-eval` prints with --json: where the run is, and its summary (with the
    hosts and reassignments of a sharded eval)."""
    out = {"run_dir": str(run.path), "run_id": run.run_id, "summary": res.summary(run)}
    shards = run.result.get("shards")
    if shards:
        out["hosts"] = shards["hosts"]
        out["reassigned"] = run.result.get("reassigned", [])
    return out


def render_eval_run(run: res.Run) -> None:
    """The end of `remote-eval`: the summary, how a sharded eval was split, the folder."""
    render_summary(run)
    shards = run.result.get("shards")
    if shards:
        console.print(
            f"sharded across {', '.join(shards['hosts'])}; ground truth from "
            f"{shards['ground_truth']['obtained_on']}, one file sliced per shard"
        )
        for r in run.result.get("reassigned", []):
            moved = ", ".join(f"{len(ids)} to {h}" for h, ids in r["to"].items())
            console.print(
                f"[yellow]{r['host']} failed ({r['reason']}):[/] kept "
                f"{len(r['kept'])} sample(s), re-ran {moved or 'none'}"
            )
    console.print(f"results: {run.path}")


def _kv_table(title: str, data: dict) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in _flatten(data):
        if k.rsplit(".", 1)[-1] in TIME_KEYS and isinstance(v, (int, float)) and v > 1e8:
            table.add_row(k, res.format_time(v))
            continue
        table.add_row(k, fmt(v) if not isinstance(v, (list, dict)) else json.dumps(v)[:120])
    return table


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if not isinstance(data, dict):
        return [(prefix or "value", data)]
    out = []
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out += _flatten(v, key)
        else:
            out.append((key, v))
    return out


def render_run(run: res.Run) -> None:
    """One run in full (`results show`): summary, DDTree budgets, acceptance histogram,
    per-position acceptance, target agreement, timings, environment, ground truth."""
    render_summary(run)
    m = run.metrics
    dd = m.get("ddtree") or {}
    if dd:
        t = Table(title="DDTree budgets")
        for col in ("budget (nodes)", "per-depth top-k", "tau", "tau (tokens)", "rounds"):
            t.add_column(col)
        for b, v in sorted(dd.items(), key=lambda kv: res.budget_key(kv[0])):
            t.add_row(
                str(v.get("budget", b)),
                fmt(v.get("topk")),
                fmt(v.get("tau_per_sample_mean")),
                fmt(v.get("tau_token_weighted")),
                fmt(v.get("rounds")),
            )
        console.print(t)
    hist = res.histogram(run)
    if hist:
        total = sum(c for _, c in hist) or 1
        t = Table(title="acceptance histogram")
        for col in ("length", "rounds", "share", ""):
            t.add_column(col)
        for k, c in hist:
            t.add_row(str(k), str(c), pct(c / total), "#" * round(40 * c / total))
        console.print(t)
    pos = res.per_position(run)
    if pos:
        t = Table(title="per-position acceptance (position j correct given 1..j-1 correct)")
        for col in ("position", "attempts", "accepted", "rate"):
            t.add_column(col)
        for p in pos:
            t.add_row(
                str(p.get("position")),
                fmt(p.get("attempts")),
                fmt(p.get("accepted")),
                pct(p.get("rate")),
            )
        console.print(t)
    agreement = m.get("target_agreement")
    if agreement:
        console.print(_kv_table("target agreement (host argmax = ground truth)", agreement))
    for key, title in (("timings", "timings"), ("environment", "environment")):
        if run.result.get(key):
            console.print(_kv_table(title, run.result[key]))
    gt = res.ground_truth_source(run)
    if gt:
        console.print(
            _kv_table("ground truth source", {k: v for k, v in gt.items() if k != "warnings"})
        )
    pngs = sorted(p.name for p in run.path.glob("*.png"))
    console.print(f"folder: {run.path}" + (f"  plots: {', '.join(pngs)}" if pngs else ""))


def render_found(found: res.Run | catalog.ParityRun) -> None:
    """`results show`: a parity run as parity's table, an eval run in full."""
    if isinstance(found, catalog.ParityRun):
        render_parity(found.result, found.path)
    else:
        render_run(found)


def found_json(found: res.Run | catalog.ParityRun) -> dict:
    """`results show --json`: the run's result document."""
    return found.result


# ---- the results folder ----------------------------------------------------------------------


def render_listing(listing: catalog.Listing) -> None:
    """`results list`: parity runs, then eval runs oldest first."""
    if listing.parity_runs:
        t = compact("parity runs")
        for col in ("run", "A", "B", "worst relL2 p99", "top-1", "delta tau"):
            t.add_column(col, no_wrap=True)
        for p, r in listing.parity_runs:
            s = parity_view.summary(r, p.name)
            t.add_row(
                p.name,
                s["a"],
                s["b"],
                fmt(s["worst_rel_l2_p99"]),
                pct(s["top1_agreement"]),
                fmt(s["delta_tau"]),
            )
        console.print(t)
    if not listing.runs:
        console.print(f"no runs in {listing.root}", soft_wrap=True)
        return
    table = compact(f"runs in {listing.root}")
    for col in ("run", "step", "tau", "tau tok", "DDTree max", "agree", "evaluated"):
        table.add_column(col, no_wrap=True, justify="left" if col == "run" else "right")
    for r in listing.runs:
        s = res.summary(r)
        dd = list(s["ddtree"].items())
        table.add_row(
            s["run_id"],
            fmt(s["step"]),
            fmt(s["tau"]),
            fmt(s["tau_tokens"]),
            f"{dd[-1][0]}: {fmt(dd[-1][1])}" if dd else "-",
            pct(s["target_agreement"]),
            s["created_time"][5:16],
        )
    console.print(table)


def render_comparison(c: catalog.Comparison) -> None:
    """`results compare`: the runs side by side, then each paired against the first."""
    for i, r in enumerate(c.runs):
        console.print(f"{_label(i)}: {r.run_id}", soft_wrap=True)
    t = compact("side by side")
    t.add_column("metric", style="bold", no_wrap=True)
    for i, _ in enumerate(c.runs):
        t.add_column(_label(i), justify="right")
    for metric, values in c.rows:
        is_share = metric.startswith(("share", "target", "retok"))
        t.add_row(
            metric, *[pct(v) if is_share and isinstance(v, float) else fmt(v) for v in values]
        )
    console.print(t)
    for i, p in enumerate(c.paired, 1):
        render_paired(p, _label(i), _label(0))
    if c.plot_asked and c.plot is None:
        console.print("no plot: none of these runs carries a training step")
    elif c.plot:
        console.print(f"plot: {c.plot}", soft_wrap=True)


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"R{i}"


def render_paired(p: cmp.Paired, b: str, a: str) -> None:
    """The paired comparison of run `b` against run `a`."""
    if not p.comparable:
        console.print(
            f"[bold yellow]{b} vs {a}: not comparable[/]: {'; '.join(p.problems)}", soft_wrap=True
        )
        return
    t = compact(
        f"{b} vs {a}: paired over {p.samples} samples "
        f"({p.confidence:.0%} bootstrap interval, {p.resamples} resamples)"
    )
    for col in ("metric", a, b, "delta", "interval", "improved", "worse"):
        t.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for d in p.deltas:
        colour = "green" if d.low > 0 else "red" if d.high < 0 else ""
        delta = f"[{colour}]{d.delta:+.3f}[/]" if colour else f"{d.delta:+.3f}"
        t.add_row(
            d.metric,
            fmt(d.mean_a),
            fmt(d.mean_b),
            delta,
            f"[{d.low:+.3f}, {d.high:+.3f}]",
            pct(d.improved),
            pct(d.worse),
        )
    console.print(t)
    if p.only_a or p.only_b:
        console.print(f"not paired: {p.only_a} samples only in {a}, {p.only_b} only in {b}")


def render_paths(paths: list[Path]) -> None:
    """Files written, one a line (`results plot`)."""
    for p in paths:
        console.print(str(p), soft_wrap=True)


def render_export(w: catalog.Written) -> None:
    console.print(f"exported {w.runs} run(s) as {w.format}: {w.path}", soft_wrap=True)
    if w.format == "tensorboard":
        console.print(f"view: tensorboard --logdir {w.path}", soft_wrap=True)


def render_report(w: catalog.Written) -> None:
    console.print(f"report of {w.runs} run(s): {w.path}", soft_wrap=True)


# ---- tau per checkpoint step (follow, demo) ----------------------------------------------------


def history_table(history: list[dict], title: str = "tau per checkpoint step") -> Table:
    """Step, checkpoint, tau (z-lab per-sample mean and token-weighted), DDTree tau per node
    budget and the target agreement rate; run ids are in the history JSON."""
    budgets = sorted({b for h in history for b in (h.get("ddtree") or {})}, key=int)
    table = compact(title)  # fits 80 columns
    for col in ("step", "checkpoint", "tau", "tau tok", *[f"DDTree-{b}" for b in budgets], "agree"):
        table.add_column(col, justify="left" if col == "checkpoint" else "right", no_wrap=True)
    for h in sorted(history, key=lambda h: (h.get("step") is None, h.get("step") or 0)):
        if h.get("state") != "done":
            table.add_row(
                str(h.get("step")),
                h["checkpoint"],
                f"[red]failed[/]: {(h.get('error') or '')[:60]}",
                "",
                *[""] * len(budgets),
                "",
            )
            continue
        table.add_row(
            str(h.get("step")),
            h["checkpoint"],
            num(h.get("tau")),
            num(h.get("tau_tokens")),
            *[num((h.get("ddtree") or {}).get(b)) for b in budgets],
            num(h.get("target_agreement")),
        )
    return table


def follow_json(folder: Path) -> dict:
    """`follow --json`: the follow folder, its history and its plot."""
    return {
        "state_dir": str(folder),
        "history": follow_lib.read_history(folder),
        "plot": str(folder / follow_lib.PLOT),
    }


def render_follow(folder: Path) -> None:
    """The end of `follow`: tau per step of the history, the plot, the history file."""
    console.print(history_table(follow_lib.read_history(folder)))
    plot = folder / follow_lib.PLOT
    if plot.is_file():
        console.print(f"plot: {plot}", soft_wrap=True)
    console.print(f"history: {folder / follow_lib.HISTORY}", soft_wrap=True)


def render_demo(result) -> None:
    """The end of `demo`: tau per step, where everything is, and how long each part took."""
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
