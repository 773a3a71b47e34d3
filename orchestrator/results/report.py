"""One self-contained HTML page of results: ``dflash results report [RUN...] -o report.html``.

No script, no external file, no network: the plots are inline SVG (drawn by the same
figure code as the PNGs, `orchestrator.results.plots`), the styles inline. Sections:

1. tau by training step, with token-weighted and DDTree lines, per series;
2. the comparison table: every run's headline numbers, and its paired delta tau against
   its baseline (bootstrap 95% interval, share of samples improved), or why it cannot be
   paired (`orchestrator.results.compare`). The baseline is the run named by
   ``--baseline``, else the earliest training step of the run's series (same training
   run, prompts and ground truth: `store.series_key`), whenever it was evaluated; the page
   names it;
3. per run: the acceptance histogram, per-position acceptance with attempt counts, tau
   by category and completion length (`breakdown`) with each group's paired delta against
   the run's baseline, and environment and provenance (drafter sha256 and step, trainer,
   target, ground truth, thinking mode and chat template).

Every name is escaped as text (`printable`, then HTML), and a plot that cannot be drawn
leaves a note in its place: one bad run never costs the page.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.printable import printable
from orchestrator.results import breakdown, compare, plots, speedup
from orchestrator.results import store as res
from remote.atomic import write_atomic

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.mono { font-family: ui-monospace, monospace; font-size: 12px; text-align: left;
          word-break: break-all; }
.up { color: #1a7f37; } .down { color: #c62828; } .warn { color: #b26a00; }
figure { margin: 8px 0; } figure svg { max-width: 100%; height: auto; }
details { margin: 12px 0; border-top: 1px solid #eee; padding-top: 6px; }
summary { cursor: pointer; font-weight: 600; }
.plots { display: flex; flex-wrap: wrap; gap: 8px; }
.plots figure { flex: 1 1 480px; }
.note { color: #555; font-size: 13px; }
"""


def _e(v: Any) -> str:
    return html.escape(printable("-" if v is None else str(v)))


def _f(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _figure(make: Callable[[], Any], salt: str, caption: str, failed: list[str]) -> str:
    """The figure `make` draws, inline; a figure that fails leaves a note (and a line in
    `failed`) instead of costing the page."""
    try:
        fig = make()
        drawn = plots.svg(fig, salt) if fig is not None else None
    except Exception as exc:  # a plot is a view of the JSON; the page goes on without it
        failed.append(f"{caption}: {type(exc).__name__}: {exc}")
        return f'<p class="warn">{_e(caption)}: plot failed ({_e(type(exc).__name__)})</p>'
    if drawn is None:
        return f'<p class="note">{_e(caption)}: no data</p>'
    return (
        f'<figure data-plot="{_e(salt)}">{drawn}'
        f'<figcaption class="note">{_e(caption)}</figcaption></figure>'
    )


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A table from already-escaped cells; the first `left` columns left-aligned."""
    out = ["<table><thead><tr>"]
    out += [f'<th class="{"l" if i < left else ""}">{h}</th>' for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append(
            "<tr>"
            + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
            + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def order(runs: list[res.Run]) -> list[res.Run]:
    """Runs as the report lists them: by series, then training step (runs without a step
    last), then when evaluated."""
    return sorted(
        runs,
        key=lambda r: (res.series_key(r), r.step is None, r.step or 0, r.created, r.run_id),
    )


def baselines(runs: list[res.Run], named: res.Run | None = None) -> dict[str, res.Run]:
    """Each run's baseline, by run id: `named` for all, else the earliest training step of
    the run's series (ties: the first evaluated; a series without steps: its first
    evaluated run)."""
    if named is not None:
        return {r.run_id: named for r in runs}
    first: dict[tuple, res.Run] = {}
    for r in order(runs):
        first.setdefault(res.series_key(r), r)
    return {r.run_id: first[res.series_key(r)] for r in runs}


def baseline_notes(runs: list[res.Run], named: res.Run | None = None) -> list[str]:
    """One sentence per baseline: which run, which step, and why it is the baseline."""
    if named is not None:
        return [f"baseline: {named.run_id} (step {named.step}), named by --baseline"]
    base_of = baselines(runs)
    seen: dict[str, res.Run] = {}
    for r in order(runs):
        seen.setdefault(base_of[r.run_id].run_id, base_of[r.run_id])
    return [
        f"baseline: {b.run_id} (step {b.step}), the earliest training step of "
        f"{res.series_label(res.series_key(b))}"
        for b in seen.values()
    ]


def pairings(runs: list[res.Run], named: res.Run | None = None) -> dict[str, compare.Paired]:
    """Each run paired against its baseline (`baselines`), by run id; none for a baseline
    itself. Made once per page: the comparison table and each run's groups read it."""
    base_of = baselines(runs, named)
    return {
        r.run_id: compare.paired(base_of[r.run_id], r)
        for r in runs
        if base_of[r.run_id].run_id != r.run_id
    }


def comparison_section(
    runs: list[res.Run],
    named: res.Run | None = None,
    paired: dict[str, compare.Paired] | None = None,
) -> str:
    """Headline numbers per run and the paired delta against its baseline (`baselines`;
    `paired`: the pairings when made already, `pairings`)."""
    sums = [res.summary(r) for r in runs]
    paired = pairings(runs, named) if paired is None else paired
    budgets = sorted({b for s in sums for b in s["ddtree"]}, key=res.budget_key)
    head = [
        "run",
        "checkpoint",
        "step",
        "samples",
        "tau",
        "tau (tokens)",
        *[f"DDTree-{_e(b)}" for b in budgets],
        "agreement",
        "Δ tau vs baseline",
        "95% interval",
        "improved",
    ]
    rows = []
    for run, s in zip(runs, sums, strict=True):
        cells = [
            f'<span class="mono">{_e(s["run_id"])}</span>',
            _e(s["checkpoint"]),
            _e(s["step"]),
            _e(s["samples"]),
            _f(s["tau"]),
            _f(s["tau_tokens"]),
            *[_f(s["ddtree"].get(b)) for b in budgets],
            _pct(s["target_agreement"]),
        ]
        p = paired.get(run.run_id)
        if p is None:
            cells += ["baseline", "", ""]
        else:
            d = next((d for d in p.deltas if d.metric == "tau"), None)
            if not p.comparable or d is None:
                cells += [
                    f'<span class="warn">not comparable: {_e("; ".join(p.problems))}</span>',
                    "",
                    "",
                ]
            else:
                cls = "up" if d.low > 0 else "down" if d.high < 0 else ""
                cells += [
                    f'<span class="{cls}">{d.delta:+.3f}</span>',
                    f"[{d.low:+.3f}, {d.high:+.3f}]",
                    f"{_pct(d.improved)} ({p.samples} paired)",
                ]
        rows.append(cells)
    notes = "".join(f'<p class="note">{_e(n)}.</p>' for n in baseline_notes(runs, named))
    return (
        notes
        + _table(head, rows, left=2)
        + '<p class="note">tau: mean over samples of each sample\'s mean acceptance length '
        "(z-lab's number); tau (tokens): accepted tokens / rounds. Δ tau pairs each run "
        "with its baseline sample by sample; the interval is a seeded percentile bootstrap "
        f"({compare.RESAMPLES} resamples); green: the whole interval is above 0.</p>"
    )


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
        ("engine", res.engine(run)),
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
        ("thinking mode", res.thinking(run)),
        ("chat template sha256", res.chat_template(run)),
        (
            "python / torch / transformers",
            f"{env.get('python')} / {env.get('torch')} / {env.get('transformers')}",
        ),
        ("host cpus / threads", f"{env.get('cpus')} / {env.get('threads')}"),
        (
            "eval time",
            f"{_f(timings.get('eval_s'), 1)} s, {_f(timings.get('tokens_per_s'), 0)} tokens/s",
        ),
        ("folder", str(run.path)),
    ]


def breakdown_tables(run: res.Run, paired: compare.Paired | None) -> str:
    """tau by category, sub-category and completion length (`breakdown`; axes of two groups
    or more), with each group's paired delta against the run's baseline and its interval
    (`paired`, when the two are comparable)."""
    groups = breakdown.worth_showing(breakdown.of_run(run))
    if not groups:
        return ""
    by_group = {(g.axis, g.name): g for g in paired.groups} if paired and paired.comparable else {}
    out = []
    for axis in breakdown.AXES:
        rows = groups.get(axis) or []
        if not rows:
            continue
        budgets = list(dict.fromkeys(b for g in rows for b in g["ddtree"]))
        head = ["group", "samples", "tau", "tau (tokens)", *[f"DDTree-{_e(b)}" for b in budgets]]
        if by_group:
            head += ["Δ tau vs baseline", "95% interval"]
        cells = []
        for g in rows:
            row = [_e(g["name"]), _e(g["samples"]), _f(g["tau"]), _f(g["tau_tokens"])]
            row += [_f(g["ddtree"].get(b)) for b in budgets]
            if by_group:
                found = by_group.get((axis, g["name"]))
                d = next((d for d in found.deltas if d.metric == "tau"), None) if found else None
                cls = "" if d is None else "up" if d.low > 0 else "down" if d.high < 0 else ""
                row += (
                    ["-", ""]
                    if d is None
                    else [
                        f'<span class="{cls}">{d.delta:+.3f}</span>',
                        f"[{d.low:+.3f}, {d.high:+.3f}]",
                    ]
                )
            cells.append(row)
        out.append(f"<h3>{_e(breakdown.TITLES[axis])}</h3>" + _table(head, cells))
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
    look = (_e, _e, _f, _f, _e, _ms, _e, _x)  # each of speedup.TRADEOFF_COLUMNS
    cells = [
        [cell(v) for cell, v in zip(look, row, strict=True)] for row in speedup.tradeoff_rows(trade)
    ]
    why = trade["costs_error"] or trade["tree_verify_error"]
    note = (
        f'<p class="note">{_e(trade["formula"])}; t_step {_ms(trade["target_step_s"])} ms, '
        f"t_draft {_ms(trade['drafter_round_s'])} ms (measured on the eval host, "
        f"docs/results.md){'; ' + _e(why) if why else ''}</p>"
    )
    return _table(speedup.TRADEOFF_COLUMNS, cells) + note


def run_section(
    run: res.Run,
    index: int,
    open_: bool,
    failed: list[str],
    paired: compare.Paired | None = None,
) -> str:
    s = res.summary(run)
    m = run.metrics
    prov = _table(
        ["", "value"],
        [[_e(k), f'<span class="mono">{_e(v)}</span>'] for k, v in provenance(run)],
        left=2,
    )
    warnings = "".join(
        f'<p class="warn">warning: {_e(w)}</p>'
        for w in res.ground_truth_source(run).get("warnings") or []
    )
    return (
        f'<details id="run-{index}"{" open" if open_ else ""}><summary>'
        f"{_e(s['checkpoint'])} (step {_e(s['step'])}): tau {_f(s['tau'])}, token-weighted "
        f'{_f(s["tau_tokens"])} <span class="note">{_e(run.run_id)}</span></summary>'
        f"{warnings}"
        '<div class="plots">'
        + _figure(
            lambda: plots.histogram_figure(run),
            f"hist{index}",
            f"share of rounds per acceptance length ({run.run_id})",
            failed,
        )
        + _figure(
            lambda: plots.per_position_figure(run),
            f"pos{index}",
            f"acceptance per draft position, n = rounds that reached it ({run.run_id})",
            failed,
        )
        + (
            _figure(
                lambda: plots.breakdown_figure(run),
                f"cat{index}",
                f"tau by category and completion length ({run.run_id})",
                failed,
            )
            if breakdown.worth_showing(breakdown.of_run(run))
            else ""
        )
        + (
            _figure(
                lambda: plots.tradeoff_figure(run),
                f"trade{index}",
                f"DDTree budget trade-off: tau and estimated speedup per node budget, the "
                f"chain dotted ({run.run_id})",
                failed,
            )
            if m.get("ddtree")
            else ""
        )
        + "</div>"
        + tradeoff_table(run)
        + breakdown_tables(run, paired)
        + "<h3>environment and provenance</h3>"
        + prov
        + "</details>"
    )


@dataclass
class Page:
    """A report written: where, and what its reader should know (its baselines, the plots
    that could not be drawn)."""

    path: Path
    notes: list[str] = field(default_factory=list)


def render(
    runs: list[res.Run], title: str = "dflash results", baseline: res.Run | None = None
) -> tuple[str, list[str]]:
    """The whole page for `runs` (each compared with its baseline, see `baselines`) and
    its notes (the baselines, and any plot that failed)."""
    if not runs:
        raise DflashError("no runs to report")
    if baseline is not None and baseline.run_id not in {r.run_id for r in runs}:
        runs = [baseline, *runs]
    runs = order(runs)
    paired = pairings(runs, baseline)
    failed: list[str] = []
    by_step = [r for r in runs if r.step is not None]
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="note">{len(runs)} run(s), report written '
        f"{_e(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>",
        "<h2>tau by training step</h2>",
        _figure(
            lambda: plots.tau_by_step_figure(by_step),
            "tau",
            "solid: tau; dashed: token-weighted tau; dotted: DDTree tau per node budget",
            failed,
        )
        if by_step
        else '<p class="note">no run carries a training step</p>',
        "<h2>comparison</h2>",
        comparison_section(runs, baseline, paired),
        "<h2>runs</h2>",
        *[
            run_section(r, i, (i == len(runs) - 1), failed, paired.get(r.run_id))
            for i, r in enumerate(runs)
        ],
        "</body></html>\n",
    ]
    notes = baseline_notes(runs, baseline) + [f"plot failed: {f}" for f in failed]
    return "".join(parts), notes


def write_report(
    runs: list[res.Run],
    path: str | Path,
    title: str = "dflash results",
    baseline: res.Run | None = None,
) -> Page:
    """Render and write the page atomically (a reader never sees half a page)."""
    path = Path(path)
    if path.is_dir():
        raise DflashError(f"{path} is a folder; give a file name such as {path}/report.html")
    text, notes = render(runs, title, baseline)
    write_atomic(path, text)
    return Page(path, notes)
