"""One run's section of the HTML report (`orchestrator.results.report`): its plots, DDTree
trade-off, tau by category and completion length with the paired delta per group, and
environment and provenance."""

from __future__ import annotations

from typing import Any

from orchestrator.results import breakdown, compare, plots, settings, speedup, summary
from orchestrator.results import store as res
from orchestrator.results.report_html import delta_cells, esc, figure, number, table
from remote.protocol import metrics as registry


def provenance(run: res.Run) -> list[tuple[str, Any]]:
    """Environment and provenance of a run, as (label, value) rows."""
    inputs = run.result.get("inputs") or {}
    env = run.result.get("environment") or {}
    timings = run.result.get("timings") or {}
    d = run.drafter
    src = d.get("source") or {}
    t = run.training_run
    gt = res.ground_truth_source(run)
    prompts = run.spec.get("prompts") or inputs.get("prompts") or {}
    target = inputs.get("target_identity") or {}
    return [
        ("drafter sha256", d.get("sha256")),
        ("drafter hashed by", d.get("hashed_by")),
        ("training step", f"{run.step} (from {d.get('step_from') or 'the checkpoint name'})"),
        ("training run", f"{t.name}: {t.host}:{t.folder}"),
        ("relayed from", f"{src.get('host')}:{src.get('path')}" if src else None),
        ("relayed at", d.get("relayed_at")),
        ("drafter on eval host", inputs.get("drafter") or run.spec.get("drafter")),
        (
            "eval host / job",
            f"{run.spec.get('host') or '-'} / "
            f"{(run.result.get('job') or {}).get('job_id') or run.run_id}",
        ),
        ("evaluated", res.format_time(run.created)),
        ("engine", settings.engine(run)),
        (
            "target",
            f"{inputs.get('target')} ({inputs.get('target_architecture')}, "
            f"{inputs.get('target_layers')} layers)",
        ),
        ("target config sha256", target.get("config_sha256")),
        ("dtype", env.get("dtype")),
        (
            "prompts",
            f"{prompts.get('name')} (sha256 {prompts.get('sha256') or '-'})" if prompts else None,
        ),
        (
            "ground truth",
            f"{gt.get('kind')} {gt.get('url') or gt.get('path') or ''}"
            f"{' (cached on host)' if gt.get('cached') else ''}",
        ),
        ("ground truth sha256", inputs.get("ground_truth_sha256")),
        ("thinking mode", settings.thinking(run)),
        ("sampling", settings.sampling(run)),
        ("chat template sha256", settings.chat_template(run)),
        (
            "python / torch / transformers",
            f"{env.get('python')} / {env.get('torch')} / {env.get('transformers')}",
        ),
        ("host cpus / threads", f"{env.get('cpus')} / {env.get('threads')}"),
        (
            "eval time",
            f"{number(timings.get('eval_s'), 1)} s, "
            f"{number(timings.get('tokens_per_s'), 0)} tokens/s",
        ),
        ("folder", str(run.path)),
    ]


def breakdown_tables(run: res.Run, paired: compare.Paired | None) -> str:
    """The registry's table metrics by category, sub-category and completion length
    (`breakdown`; axes of two groups or more) and the headline per DDTree budget, with
    each group's paired delta against the run's baseline and its interval (`paired`,
    when the two are comparable)."""
    groups = breakdown.worth_showing(breakdown.of_run(run))
    if not groups:
        return ""
    by_group = {(g.axis, g.name): g for g in paired.groups} if paired and paired.comparable else {}
    every = [g for rows in groups.values() for g in rows]
    cols, head_metric = summary.columns(every), registry.headline()
    label = compare.headline_label(g.deltas for g in by_group.values())
    out = []
    for axis in breakdown.AXES:
        rows = groups.get(axis) or []
        if not rows:
            continue
        budgets = list(dict.fromkeys(b for g in rows for b in g["ddtree"]))
        head = ["group", *[esc(m.header) for m in cols]]
        head += [esc(summary.budget_label(head_metric, b)) for b in budgets]
        if by_group:
            head += [f"Δ {esc(label)} vs baseline", "95% interval"]
        cells = []
        for g in rows:
            row = [esc(g["name"]), *[esc(summary.shown(m, g[m.name])) for m in cols]]
            row += [number(g["ddtree"].get(b)) for b in budgets]
            if by_group:
                found = by_group.get((axis, g["name"]))
                d = compare.headline(found.deltas) if found else None
                row += ["-", ""] if d is None else delta_cells(d)
            cells.append(row)
        out.append(f"<h3>{esc(breakdown.TITLES[axis])}</h3>" + table(head, cells))
    return "".join(out)


def keyed_tables(run: res.Run, paired: compare.Paired | None = None) -> str:
    """Each per-key metric of the registry (`Keyed`) as a table of its rows; a paired one
    (tau by context) with each key's paired delta against the run's baseline and its
    interval (`paired`, when the two are comparable)."""
    by_group = {(g.axis, g.name): g for g in paired.groups} if paired and paired.comparable else {}
    out = []
    for m in registry.keyed():
        head, rows = summary.keyed_table(run, m.name)
        if not rows:
            continue
        cells = [[esc(c) for c in r] for r in rows]
        if m.paired and by_group:
            head = [*head, "Δ vs baseline", "95% interval"]
            for c, r in zip(cells, summary.keyed_rows(run, m.name), strict=True):
                g = by_group.get((m.key_name, str(r["key"])))
                d = compare.group_lead(g) if g else None
                c += ["-", ""] if d is None else delta_cells(d)
        out.append(f"<h3>{esc(m.label)}</h3>" + table([esc(h) for h in head], cells))
    return "".join(out)


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3f}"


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def tradeoff_table(run: res.Run) -> str:
    """DDTree's budgets (`speedup.tradeoff`): tau, verify cost and speedup estimate per
    node budget, the chain walk's as the last row, and the formula with its costs."""
    trade = speedup.tradeoff(run)
    if not trade:
        return ""
    look = (esc, esc, number, number, esc, _ms, esc, _x)  # each of speedup.TRADEOFF_COLUMNS
    cells = [
        [cell(v) for cell, v in zip(look, row, strict=True)] for row in speedup.tradeoff_rows(trade)
    ]
    why = trade["costs_error"] or trade["tree_verify_error"]
    note = (
        f'<p class="note">{esc(trade["formula"])}; t_step {_ms(trade["target_step_s"])} ms, '
        f"t_draft {_ms(trade['drafter_round_s'])} ms (measured on the eval host, "
        f"docs/results.md){'; ' + esc(why) if why else ''}</p>"
    )
    return table(speedup.TRADEOFF_COLUMNS, cells) + note


def run_section(
    run: res.Run,
    index: int,
    open_: bool,
    failed: list[str],
    paired: compare.Paired | None = None,
) -> str:
    got = summary.values(run)
    headline = ", ".join(
        f"{esc(m.header)} {esc(summary.shown(m, got[m.name]))}"
        for m in summary.columns([got])
        if m.style != "count"
    )
    prov = table(
        ["", "value"],
        [[esc(k), f'<span class="mono">{esc(v)}</span>'] for k, v in provenance(run)],
        left=2,
    )
    warnings = "".join(
        f'<p class="warn">warning: {esc(w)}</p>'
        for w in [
            *(res.ground_truth_source(run).get("warnings") or []),
            *settings.window_warnings(run),
        ]
    )
    return (
        f'<details id="run-{index}"{" open" if open_ else ""}><summary>'
        f"{esc(run.checkpoint)} (step {esc(run.step)}): {headline} "
        f'<span class="note">{esc(run.run_id)}</span></summary>'
        f"{warnings}"
        '<div class="plots">'
        + "".join(
            figure(
                lambda n=m.name: plots.keyed_figure(run, n),
                f"{m.name}{index}",
                f"{m.definition} ({run.run_id})",
                failed,
            )
            for m in registry.keyed()
        )
        + (
            figure(
                lambda: plots.breakdown_figure(run),
                f"cat{index}",
                f"tau by category and completion length ({run.run_id})",
                failed,
            )
            if breakdown.worth_showing(breakdown.of_run(run))
            else ""
        )
        + (
            figure(
                lambda: plots.tradeoff_figure(run),
                f"trade{index}",
                f"DDTree budget trade-off: tau and estimated speedup per node budget, the "
                f"chain dotted ({run.run_id})",
                failed,
            )
            if run.metrics.get("ddtree")
            else ""
        )
        + "</div>"
        + tradeoff_table(run)
        + "".join(
            f'<p class="note">{esc(f.label)}: {esc(line)}</p>'
            for f, line in zip(registry.findings(), summary.found(run).values(), strict=True)
        )
        + keyed_tables(run, paired)
        + breakdown_tables(run, paired)
        + "<h3>environment and provenance</h3>"
        + prov
        + "</details>"
    )
