"""How one eval run looks to people: its summary (the end of `remote-eval`) and its full
view (`results show`), every metric as the registry prints it. Each ``render_*`` prints
one command's result; each ``*_json`` is its ``--json`` form. The results folder's other
views: `listing`; tau per checkpoint step: `history`."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.commands.output.base import console, fmt, pct, plain, show
from orchestrator.commands.output.breakdown import render_breakdown
from orchestrator.commands.output.parity import render_parity
from orchestrator.commands.output.speedup import speedup_line, tradeoff_table
from orchestrator.commands.output.tables import Col, Grid, kv, styled
from orchestrator.results import breakdown, catalog, online_view, settings, speedup, summary, sweep
from orchestrator.results import store as res
from remote.protocol import TARGET_LOADED_ENDS
from remote.protocol import metrics as registry

# Keys whose numbers are Unix times: shown as dates.
TIME_KEYS = {"generated", "created", "pulled", "time", "started", "finished", "made"}

# How a result's ``expected`` was computed (remote.eval.sampled.METHODS), in a row's words.
EXPECTED_METHODS = {
    "dp": "exact, every position",
    "walk": "exact, the walk's rounds",
    "seeded": "seeded walks, an estimate",
}


def _line(text: str, soft_wrap: bool = True) -> None:
    """A line of literal text (names, paths), never cut: one logical line that the
    terminal wraps (copyable), or with ``soft_wrap=False`` wrapped here to the width."""
    console.print(plain(text), soft_wrap=soft_wrap)


# ---- one eval run ---------------------------------------------------------------------------


def metric_rows(run: res.Run) -> list[tuple[str, str]]:
    """Every scalar metric of the registry by its label, as it prints: the walk's, then
    each per DDTree budget, then the sample's; the counts together in the last row."""
    got, spread = summary.values(run), summary.intervals(run)
    walk, sample = registry.scalars(registry.WALK), registry.scalars(registry.SAMPLE)
    counts = [m for m in registry.scalars() if m.style == "count"]
    rows = [
        (m.label, summary.with_interval(m, got[m.name], spread.get(m.name)))
        for m in walk
        if m not in counts
    ]
    for m in summary.per_budget():
        rows += [
            (summary.budget_label(m, b), summary.shown(m, v))
            for b, v in summary.budget_values(run, m).items()
        ]
    rows += [
        (m.label, summary.with_interval(m, got[m.name], spread.get(m.name)))
        for m in sample
        if m not in counts and not (m.sparse and got[m.name] is None)
    ]
    rows += [
        (f.label, fmt(line))
        for f, line in zip(registry.findings(), summary.found(run).values(), strict=True)
    ]
    rows.append(
        (
            " / ".join(m.label for m in counts),
            " / ".join(summary.shown(m, got[m.name]) for m in counts),
        )
    )
    return rows


def render_summary(run: res.Run) -> None:
    """The headline table of one run (also printed at the end of `remote-eval`)."""
    s = summary.summary(run)
    rows: list[tuple[str, object]] = [
        *metric_rows(run),
        ("speedup estimate (chain; see docs/results.md)", speedup_line(run)),
        (
            "training run",
            f"{run.training_run.name} ({run.training_run.host}:{run.training_run.folder})",
        ),
        ("step", fmt(s["step"])),
        ("drafter sha256", fmt(s["drafter_sha256"])),  # a sha256 wraps, never cut
        ("evaluated", s["created_time"]),
    ]
    gt = res.ground_truth_source(run)
    src = gt.get("kind") or "-"
    if gt.get("url"):
        src += f" {gt['url']}"
    if gt.get("cached"):
        src += " (cached on host)"
    rows.append(("ground truth", src))
    feats = settings.target_features(run)  # from the host's cache, or the target's forward
    if feats:
        got = f"{fmt(feats.get('samples_cached') or 0)} of {fmt(s['samples'])} cached on host"
        if feats.get("target_loaded") == TARGET_LOADED_ENDS:
            got += " (target's layers not loaded)"
        rows.append(("target features", "cache off" if feats.get("cache") == "off" else got))
    rows.append(
        ("thinking / chat template", f"{fmt(s['thinking'])} / {fmt(s['chat_template_sha256'])}")
    )
    rows.append(("sampling", s["sampling"]))
    expected = run.result.get("expected")
    if isinstance(expected, dict):  # speculative sampling's tau in expectation
        weighted = fmt(expected.get("tau_token_weighted"))
        if expected.get("tau_token_weighted_se") is not None:
            weighted += f" ± {fmt(expected['tau_token_weighted_se'])}"
        how = EXPECTED_METHODS.get(expected.get("method"), "exact")
        rows.append(
            (
                f"expected tau / token-weighted ({how})",
                f"{fmt(expected.get('tau'))} ± {fmt(expected.get('tau_se'))} / {weighted}",
            )
        )
    if s["retokenisation_mismatch"] is not None:
        rows.append(
            ("retokenisation mismatch", styled(pct(s["retokenisation_mismatch"]), "yellow"))
        )
    show(kv(f"{s['checkpoint']}  ({s['run_id']})", rows))
    for w in [*(gt.get("warnings") or []), *settings.window_warnings(run)]:
        console.print(f"[bold yellow]warning:[/] {plain(w)}", soft_wrap=True)


def eval_run_json(run: res.Run) -> dict:
    """What `remote-eval` prints with --json: where the run is, and its summary (with the
    hosts and reassignments of a sharded eval)."""
    out = {
        "run_dir": str(run.path),
        "run_id": run.run_id,
        "summary": summary.summary(run),
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
    other = settings.beside(run)
    if other is not None:  # another run of this checkpoint: what sets the two apart
        console.print(styled(settings.beside_line(run, other), "yellow"), soft_wrap=True)
    verdict = online_view.load_verdict(run.path)
    if verdict is not None:  # an online measurement: offline beside online
        from orchestrator.commands.output.online import render_verdict

        render_verdict(verdict, run)
    render_breakdown(breakdown.of_run(run))
    trade = speedup.tradeoff(run)
    if trade:
        show(tradeoff_table(trade))
    for m in registry.keyed():
        render_keyed(run, m)
    agreement = run.metrics.get("target_agreement")
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


def render_keyed(run: res.Run, m: registry.Keyed) -> None:
    """A per-key metric as a table (`summary.keyed_table`); a count's share (of its
    group's) as a bar."""
    head, rows = summary.keyed_table(run, m.name)
    if not rows:
        return
    cols = [Col(h, "num", justify="right") for h in head]
    bars = []
    if m.reduce == registry.SUM:
        bars = ["#" * round(40 * (s or 0)) for s in summary.shares(summary.keyed_rows(run, m.name))]
        cols.append(Col("", "id", drop=1))
    t = Grid(m.label, cols, compact=False)
    for i, r in enumerate(rows):
        t.row(*r, *bars[i : i + 1])
    show(t)


def render_found(found: res.Run | catalog.ParityRun | sweep.Sweep) -> None:
    """`results show`: a sweep's table, a parity run as parity's table, an eval run in full."""
    if isinstance(found, sweep.Sweep):
        from orchestrator.commands.output.sweep import render_sweep

        render_sweep(found)
    elif isinstance(found, catalog.ParityRun):
        render_parity(found.result, found.path)
    else:
        render_run(found)


def found_json(found: res.Run | catalog.ParityRun | sweep.Sweep) -> dict:
    """`results show --json`: the run's result document; an eval run's with ``breakdown``
    (tau by category and completion length, derived from its samples) and
    ``ddtree_tradeoff`` (`speedup.tradeoff`: tau, verify cost and speedup estimate per
    DDTree budget, the chain's beside) and ``beside`` (another run of the checkpoint and
    how its settings differ: `settings.beside`) added."""
    if isinstance(found, sweep.Sweep):
        return sweep.to_json(found)
    if isinstance(found, catalog.ParityRun):
        return found.result
    return {
        **found.result,
        "breakdown": breakdown.of_run(found),
        "ddtree_tradeoff": speedup.tradeoff(found),
        "beside": settings.beside(found),
    }
