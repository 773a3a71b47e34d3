"""How eval results look to people: a run's summary and full view, the list of runs, a
comparison, tau per checkpoint step (follow, demo), parity, and the jobs on eval hosts.
Each ``render_*`` prints one command's result; each ``*_json`` is its ``--json`` form
when that is not the result itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.text import Text

from orchestrator.commands.output.base import (
    console,
    err_console,
    exit_with,
    fmt,
    num,
    pct,
    plain,
    show,
)
from orchestrator.commands.output.breakdown import render_breakdown, render_group_deltas
from orchestrator.commands.output.parity import render_parity
from orchestrator.commands.output.speedup import speedup_line, tradeoff_table
from orchestrator.commands.output.tables import Col, Grid, kv, styled
from orchestrator.eval.follow import loop as follow_lib
from orchestrator.results import breakdown, catalog, online_view, parity_view, speedup
from orchestrator.results import compare as cmp
from orchestrator.results import store as res
from remote.protocol import TARGET_LOADED_ENDS

# Keys whose numbers are Unix times: shown as dates.
TIME_KEYS = {"generated", "created", "pulled", "time", "started", "finished", "made"}


def _line(text: str, soft_wrap: bool = True) -> None:
    """A line of literal text (names, paths), never cut: one logical line that the
    terminal wraps (copyable), or with ``soft_wrap=False`` wrapped here to the width."""
    console.print(plain(text), soft_wrap=soft_wrap)


# ---- one eval run ---------------------------------------------------------------------------


def render_summary(run: res.Run) -> None:
    """The headline table of one run (also printed at the end of `remote-eval`)."""
    s = res.summary(run)
    rows: list[tuple[str, object]] = [
        ("tau (z-lab: mean of per-sample means)", fmt(s["tau"])),
        ("tau (token-weighted: tokens / rounds)", fmt(s["tau_tokens"])),
        *[(f"DDTree-{b} tau", fmt(v)) for b, v in s["ddtree"].items()],
        ("target agreement", pct(s["target_agreement"])),
        ("speedup estimate (chain; see docs/results.md)", speedup_line(run)),
        (
            "training run",
            f"{run.training_run.name} ({run.training_run.host}:{run.training_run.folder})",
        ),
        ("step", fmt(s["step"])),
        ("drafter sha256", fmt(s["drafter_sha256"])),  # a sha256 wraps, never cut
        ("evaluated", s["created_time"]),
        (
            "samples / tokens / rounds",
            f"{fmt(s['samples'])} / {fmt(s['tokens'])} / {fmt(s['rounds'])}",
        ),
    ]
    gt = res.ground_truth_source(run)
    src = gt.get("kind") or "-"
    if gt.get("url"):
        src += f" {gt['url']}"
    if gt.get("cached"):
        src += " (cached on host)"
    rows.append(("ground truth", src))
    feats = res.target_features(run)  # from the host's cache, or the target's forward
    if feats:
        got = f"{fmt(feats.get('samples_cached') or 0)} of {fmt(s['samples'])} cached on host"
        if feats.get("target_loaded") == TARGET_LOADED_ENDS:
            got += " (target's layers not loaded)"
        rows.append(("target features", "cache off" if feats.get("cache") == "off" else got))
    rows.append(
        ("thinking / chat template", f"{fmt(s['thinking'])} / {fmt(s['chat_template_sha256'])}")
    )
    if s["retokenisation_mismatch"] is not None:
        rows.append(
            ("retokenisation mismatch", styled(pct(s["retokenisation_mismatch"]), "yellow"))
        )
    show(kv(f"{s['checkpoint']}  ({s['run_id']})", rows))
    for w in gt.get("warnings") or []:
        console.print(f"[bold yellow]warning:[/] {plain(w)}", soft_wrap=True)


def eval_run_json(run: res.Run) -> dict:
    """What `remote-eval` prints with --json: where the run is, and its summary (with the
    hosts and reassignments of a sharded eval)."""
    out = {
        "run_dir": str(run.path),
        "run_id": run.run_id,
        "summary": res.summary(run),
        "breakdown": breakdown.of_run(run),
        "ddtree_tradeoff": speedup.tradeoff(run),
    }
    shards = run.result.get("shards")
    if shards:
        out["hosts"] = shards["hosts"]
        out["reassigned"] = run.result.get("reassigned", [])
    return out


def render_eval_run(run: res.Run) -> None:
    """The end of `remote-eval`: the summary, tau by category and completion length, how a
    sharded eval was split, the folder."""
    render_summary(run)
    render_breakdown(breakdown.of_run(run))
    shards = run.result.get("shards")
    if shards:
        _line(
            f"sharded across {', '.join(shards['hosts'])}; ground truth from "
            f"{shards['ground_truth']['obtained_on']}, one file sliced per shard"
        )
        for r in run.result.get("reassigned", []):
            moved = ", ".join(f"{len(ids)} to {h}" for h, ids in r["to"].items())
            console.print(
                f"[yellow]{plain(r['host'])} failed ({plain(r['reason'])}):[/] kept "
                f"{len(r['kept'])} sample(s), re-ran {plain(moved or 'none')}",
                soft_wrap=True,
            )
    _line(f"results: {run.path}", soft_wrap=False)


def _kv_table(title: str, data: dict) -> Grid:
    rows = []
    for k, v in _flatten(data):
        if k.rsplit(".", 1)[-1] in TIME_KEYS and isinstance(v, (int, float)) and v > 1e8:
            rows.append((k, res.format_time(v)))
        else:
            rows.append((k, fmt(v) if not isinstance(v, (list, dict)) else json.dumps(v)))
    return kv(title, rows)


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
    """One run in full (`results show`): summary, tau by category and completion length,
    DDTree budgets, acceptance histogram, per-position acceptance, target agreement,
    timings, environment, ground truth."""
    render_summary(run)
    verdict = online_view.load_verdict(run.path)
    if verdict is not None:  # an online measurement: offline beside online
        from orchestrator.commands.output.online import render_verdict

        render_verdict(verdict, run)
    render_breakdown(breakdown.of_run(run))
    m = run.metrics
    trade = speedup.tradeoff(run)
    if trade:
        show(tradeoff_table(trade))
    hist = res.histogram(run)
    if hist:
        total = sum(c for _, c in hist) or 1
        t = Grid(
            "acceptance histogram",
            [
                Col("length", "num", justify="right"),
                Col("rounds", "num", justify="right"),
                Col("share", "num", justify="right"),
                Col("", "id", drop=1),
            ],
            compact=False,
        )
        for k, c in hist:
            t.row(str(k), str(c), pct(c / total), "#" * round(40 * c / total))
        show(t)
    pos = res.per_position(run)
    if pos:
        t = Grid(
            "per-position acceptance (position j correct given 1..j-1 correct)",
            [
                Col("position", "num", justify="right"),
                Col("attempts", "num", justify="right"),
                Col("accepted", "num", justify="right"),
                Col("rate", "num", justify="right"),
            ],
            compact=False,
        )
        for p in pos:
            t.row(
                str(p.get("position")),
                fmt(p.get("attempts")),
                fmt(p.get("accepted")),
                pct(p.get("rate")),
            )
        show(t)
    agreement = m.get("target_agreement")
    if agreement:
        show(_kv_table("target agreement (host argmax = ground truth)", agreement))
    for key, title in (("timings", "timings"), ("environment", "environment")):
        if run.result.get(key):
            show(_kv_table(title, run.result[key]))
    gt = res.ground_truth_source(run)
    if gt:
        show(_kv_table("ground truth source", {k: v for k, v in gt.items() if k != "warnings"}))
    pngs = sorted(p.name for p in run.path.glob("*.png"))
    _line(f"folder: {run.path}" + (f"  plots: {', '.join(pngs)}" if pngs else ""), soft_wrap=False)


def render_found(found: res.Run | catalog.ParityRun) -> None:
    """`results show`: a parity run as parity's table, an eval run in full."""
    if isinstance(found, catalog.ParityRun):
        render_parity(found.result, found.path)
    else:
        render_run(found)


def found_json(found: res.Run | catalog.ParityRun) -> dict:
    """`results show --json`: the run's result document; an eval run's with ``breakdown``
    (tau by category and completion length, derived from its samples) and
    ``ddtree_tradeoff`` (`speedup.tradeoff`: tau, verify cost and speedup estimate per
    DDTree budget, the chain's beside) added."""
    if isinstance(found, catalog.ParityRun):
        return found.result
    return {
        **found.result,
        "breakdown": breakdown.of_run(found),
        "ddtree_tradeoff": speedup.tradeoff(found),
    }


# ---- the results folder ----------------------------------------------------------------------


def render_listing(listing: catalog.Listing) -> None:
    """`results list`: parity runs, then eval runs oldest first, every id whole (the run
    folders that could not be read: `render_skipped`)."""
    if listing.parity_runs:
        t = Grid(
            "parity runs",
            [
                Col("run", "id"),
                Col("A"),
                Col("B"),
                Col("worst relL2 p99", "num", justify="right"),
                Col("top-1", "num", justify="right", drop=1),
                Col("delta tau", "num", justify="right"),
            ],
        )
        for p, r in listing.parity_runs:
            s = parity_view.summary(r, p.name)
            t.row(
                p.name,
                s["a"],
                s["b"],
                fmt(s["worst_rel_l2_p99"]),
                pct(s["top1_agreement"]),
                fmt(s["delta_tau"]),
            )
        show(t)
    if not listing.runs:
        _line(f"no runs in {listing.root}")
        return
    table = Grid(
        f"runs in {listing.root}",
        [
            Col("run", "id"),
            Col("step", "num", justify="right"),
            Col("tau", "num", justify="right"),
            Col("tau tok", "num", justify="right", drop=2),
            Col("DDTree max", "num", justify="right", drop=3),
            Col("agree", "num", justify="right", drop=1),
            Col("evaluated", "num", justify="right", drop=4),
        ],
    )
    for r in listing.runs:
        s = res.summary(r)
        dd = list(s["ddtree"].items())
        table.row(
            s["run_id"],
            fmt(s["step"]),
            fmt(s["tau"]),
            fmt(s["tau_tokens"]),
            f"{dd[-1][0]}: {fmt(dd[-1][1])}" if dd else "-",
            pct(s["target_agreement"]),
            s["created_time"][5:16],
        )
    show(table)


def render_skipped(skipped: list[str]) -> None:
    """Run folders left out because they could not be read: one yellow line each, on
    stderr (with or without --json), so the runs that could be read are still shown."""
    for line in skipped:
        err_console.print(f"[yellow]skipped:[/] {plain(line)}", soft_wrap=True)


def render_comparison(c: catalog.Comparison) -> None:
    """`results compare`: the runs side by side, then each paired against the first."""
    for i, r in enumerate(c.runs):
        _line(f"{_label(i)}: {r.run_id}")
    t = Grid(
        "side by side",
        [
            Col("metric", style="bold"),
            *[Col(_label(i), "id", justify="right") for i in range(len(c.runs))],
        ],
    )
    for metric, values in c.rows:
        is_share = metric.startswith(("share", "target", "retok"))
        t.row(metric, *[pct(v) if is_share and isinstance(v, float) else fmt(v) for v in values])
    show(t)
    for i, p in enumerate(c.paired, 1):
        render_paired(p, _label(i), _label(0))
    if c.plot_asked and c.plot is None:
        console.print("no plot: none of these runs carries a training step")
    elif c.plot:
        _line(f"plot: {c.plot}")


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"R{i}"


def render_paired(p: cmp.Paired, b: str, a: str) -> None:
    """The paired comparison of run `b` against run `a`."""
    if not p.comparable:
        console.print(
            f"[bold yellow]{b} vs {a}: not comparable[/]: {plain('; '.join(p.problems))}",
            soft_wrap=True,
        )
        return
    t = Grid(
        f"{b} vs {a}: paired over {p.samples} samples "
        f"({p.confidence:.0%} bootstrap interval, {p.resamples} resamples)",
        [
            Col("metric"),
            Col(a, "num", justify="right"),
            Col(b, "num", justify="right"),
            Col("delta", "num", justify="right"),
            Col("interval", "num", justify="right"),
            Col("improved", "num", justify="right", drop=1),
            Col("worse", "num", justify="right", drop=2),
        ],
    )
    for d in p.deltas:
        colour = "green" if d.low > 0 else "red" if d.high < 0 else ""
        t.row(
            d.metric,
            fmt(d.mean_a),
            fmt(d.mean_b),
            Text(f"{d.delta:+.3f}", style=colour),
            f"[{d.low:+.3f}, {d.high:+.3f}]",
            pct(d.improved),
            pct(d.worse),
        )
    show(t)
    render_group_deltas(p, b, a)
    if p.only_a or p.only_b:
        console.print(f"not paired: {p.only_a} samples only in {a}, {p.only_b} only in {b}")


def render_paths(drawn: catalog.Drawn) -> None:
    """`results plot`: the files written, one a line; then each plot that failed, on
    stderr, and exit 1 (the others were drawn all the same)."""
    for p in drawn.paths:
        _line(str(p))
    render_skipped(drawn.skipped)
    if drawn.failed:
        exit_with(1, *[f"[red]plot failed:[/] {plain(line)}" for line in drawn.failed])


def render_export(w: catalog.Written) -> None:
    """`results export`: the data itself when it went to stdout, else where it went."""
    render_skipped(w.skipped)
    if w.text is not None:
        sys.stdout.write(w.text)
        return
    _line(f"exported {w.runs} run(s) as {w.format}: {w.path}")
    if w.format == "tensorboard":
        _line(f"view: tensorboard --logdir {w.path}")


def render_report(w: catalog.Written) -> None:
    render_skipped(w.skipped)
    _line(f"report of {w.runs} run(s): {w.path}")
    for line in w.notes:
        _line(line)


# ---- tau per checkpoint step (follow, demo) ----------------------------------------------------


def history_table(history: list[dict], title: str = "tau per checkpoint step") -> Grid:
    """Step, checkpoint, tau (z-lab per-sample mean and token-weighted), DDTree tau per node
    budget and the target agreement rate, and why a checkpoint failed; run ids are in the
    history JSON. At a narrow width the smaller DDTree budgets are left out first."""
    budgets = sorted({b for h in history for b in (h.get("ddtree") or {})}, key=int)
    failed = any(h.get("state") != "done" for h in history)
    table = Grid(
        title,
        [
            Col("step", "num", justify="right"),
            Col("checkpoint"),
            Col("tau", "num", justify="right"),
            Col("tau tok", "num", justify="right", drop=len(budgets) + 2),
            *[
                Col(f"DDTree-{b}", "num", justify="right", drop=len(budgets) + 2 - i)
                for i, b in enumerate(budgets, 1)
            ],
            Col("agree", "num", justify="right", drop=len(budgets) + 3),
            *([Col("error")] if failed else []),
        ],
    )
    for h in sorted(history, key=lambda h: (h.get("step") is None, h.get("step") or 0)):
        if h.get("state") != "done":
            table.row(
                str(h.get("step")),
                h["checkpoint"],
                styled("failed", "red"),
                "",
                *[""] * len(budgets),
                "",
                h.get("error") or "",
            )
            continue
        table.row(
            str(h.get("step")),
            h["checkpoint"],
            num(h.get("tau")),
            num(h.get("tau_tokens")),
            *[num((h.get("ddtree") or {}).get(b)) for b in budgets],
            num(h.get("target_agreement")),
            *([""] if failed else []),
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
    show(history_table(follow_lib.read_history(folder)))
    plot = folder / follow_lib.PLOT
    if plot.is_file():
        _line(f"plot: {plot}")
    _line(f"history: {folder / follow_lib.HISTORY}")


def render_demo(result) -> None:
    """The end of `demo`: tau per step, where everything is, and how long each part took."""
    show(history_table(result.history, "demo: tau per checkpoint step"))
    secs = result.seconds
    _line(f"plot: {result.plot}")
    _line(f"results: {result.results_dir}")
    if result.folder:
        _line(f"demo folder (kept): {result.folder}")
    _line(
        f"models: {result.models} ({'built now' if result.built_now else 'cached'})"
        f"; {secs['total']:.0f}s in all: models {secs['models']:.0f}s, setup "
        f"{secs['setup']:.0f}s, relay+probe+eval {secs['relay_probe_eval']:.0f}s"
    )
