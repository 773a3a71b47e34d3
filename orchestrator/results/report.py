"""One self-contained HTML page of results: ``dflash results report`` (docs/results.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.results import compare, plots, summary
from orchestrator.results import store as res
from orchestrator.results import sweep as sweep_view
from orchestrator.results.report_html import STYLE, delta_cells, esc, figure, share, table
from orchestrator.results.report_run import run_section
from remote.atomic import write_atomic


def order(runs: list[res.Run]) -> list[res.Run]:
    """Runs as the report lists them: by series, step (none last), then when evaluated."""
    return sorted(
        runs,
        key=lambda r: (res.series_key(r), r.step is None, r.step or 0, r.created, r.run_id),
    )


def baselines(runs: list[res.Run], named: res.Run | None = None) -> dict[str, res.Run]:
    """Each run's baseline by run id: `named`, else its series' earliest step (`order`)."""
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
    """Each run paired against its baseline, by run id; made once, read by table and groups."""
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
    """Every table metric per run (and per DDTree budget) and the headline's paired delta
    against the run's baseline."""
    paired = pairings(runs, named) if paired is None else paired
    cols = summary.columns(summary.values(r) for r in runs)
    per = [(m, [summary.budget_values(r, m) for r in runs]) for m in summary.per_budget()]
    by_budget = [
        (m, b, [v.get(b) for v in vals])
        for m, vals in per
        for b in sorted({b for v in vals for b in v}, key=summary.budget_key)
    ]
    lead = compare.headline_label(p.deltas for p in paired.values() if p.comparable)
    head = [
        "run",
        "checkpoint",
        "step",
        *[esc(m.header) for m in cols],
        *[esc(summary.budget_label(m, b)) for m, b, _ in by_budget],
        f"Δ {esc(lead)} vs baseline",
        "95% interval",
        "improved",
    ]
    rows = []
    for i, run in enumerate(runs):
        got = summary.values(run)
        cells = [
            f'<span class="mono">{esc(run.run_id)}</span>',
            esc(run.checkpoint),
            esc(run.step),
            *[esc(summary.shown(m, got[m.name])) for m in cols],
            *[esc(summary.shown(m, vals[i])) for m, _, vals in by_budget],
        ]
        p = paired.get(run.run_id)
        d = compare.headline(p.deltas) if p is not None else None
        if p is None:
            cells += ["baseline", "", ""]
        elif not p.comparable or d is None:
            why = esc("; ".join(p.problems))
            cells += [f'<span class="warn">not comparable: {why}</span>', "", ""]
        else:
            cells += [*delta_cells(d), f"{share(d.improved)} ({p.samples} paired)"]
        rows.append(cells)
    notes = "".join(f'<p class="note">{esc(n)}.</p>' for n in baseline_notes(runs, named))
    meaning = "; ".join(f"{m.header}: {m.definition}" for m in cols)
    return (
        notes
        + table(head, rows, left=2)
        + f'<p class="note">{esc(meaning)}. Δ pairs each run with its baseline sample by '
        "sample; the interval is a seeded percentile bootstrap "
        f"({compare.RESAMPLES} resamples); green: the whole interval is above 0.</p>"
    )


def sweep_section(sweeps: list[sweep_view.Sweep], failed: list[str]) -> str:
    """Each temperature sweep: tau against T, plotted and as a table."""
    out = []
    for s in sweeps:
        rows = [
            [
                esc(f"{r['temperature']:g}"),
                esc(summary.shown("num", r["tau"])),
                esc(" - ".join(f"{v:.3f}" for v in r["tau_interval"] or []) or "-"),
                esc(summary.shown("num", r["tau_token_weighted"])),
                f'<span class="mono">{esc(r["run_id"])}</span>',
            ]
            for r in s.rows
        ]
        out += [
            f'<h3 class="mono">{esc(s.sweep_id)}</h3>',
            figure(lambda s=s: sweep_view.figure(s), s.sweep_id, "tau by temperature", failed),
            table(["T", "tau", "95% interval", "tau tok", "run"], rows),
        ]
    return "".join(out)


@dataclass
class Page:
    """A report written: where, and its notes (baselines, plots not drawn)."""

    path: Path
    notes: list[str] = field(default_factory=list)


def render(
    runs: list[res.Run],
    title: str = "dflash results",
    baseline: res.Run | None = None,
    sweeps: list[sweep_view.Sweep] | None = None,
) -> tuple[str, list[str]]:
    """The whole page for `runs` and its notes (the baselines, any plot that failed)."""
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
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="note">{len(runs)} run(s), report written '
        f"{esc(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>",
        "<h2>tau by training step</h2>",
        figure(
            lambda: plots.tau_by_step_figure(by_step),
            "tau",
            "solid: tau; dashed: token-weighted tau; dotted: DDTree tau per node budget",
            failed,
        )
        if by_step
        else '<p class="note">no run carries a training step</p>',
        "<h2>comparison</h2>",
        comparison_section(runs, baseline, paired),
        *(["<h2>temperature sweeps</h2>", sweep_section(sweeps, failed)] if sweeps else []),
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
    sweeps: list[sweep_view.Sweep] | None = None,
) -> Page:
    """Render and write the page atomically; `sweeps`: those whose runs are all in it."""
    path = Path(path)
    if path.is_dir():
        raise DflashError(f"{path} is a folder; give a file name such as {path}/report.html")
    ids = {r.run_id for r in runs}
    sweeps = [s for s in sweeps or [] if all(r["run_id"] in ids for r in s.rows)]
    text, notes = render(runs, title, baseline, sweeps)
    write_atomic(path, text)
    return Page(path, notes)
