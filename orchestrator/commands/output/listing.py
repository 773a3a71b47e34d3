"""How the results folder looks to people: the list of runs (`results list`), a comparison
with its paired deltas and the CI gate's verdict (`results compare`), and what plot,
export and report wrote. Every metric column comes from the registry."""

from __future__ import annotations

import sys

from rich.text import Text

from orchestrator.commands.output.base import console, err_console, exit_with, fmt, pct, plain, show
from orchestrator.commands.output.breakdown import render_group_deltas
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import catalog, parity_view, summary
from orchestrator.results import compare as cmp
from orchestrator.results import store as res
from remote.protocol import metrics as registry


def _line(text: str, soft_wrap: bool = True) -> None:
    """A line of literal text (names, paths), never cut (see `results._line`)."""
    console.print(plain(text), soft_wrap=soft_wrap)


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
    if listing.sweeps:
        from orchestrator.commands.output.sweep import sweep_table

        sweep_table(listing.sweeps)
    if not listing.runs:
        _line(f"no runs in {listing.root}")
        return
    cols = summary.columns(summary.values(r) for r in listing.runs)
    last = max((m.rank for m in cols), default=0)
    table = Grid(
        f"runs in {listing.root}",
        [
            Col("run", "id"),
            Col("step", "num", justify="right"),
            *[Col(m.header, "num", justify="right", drop=m.rank) for m in cols],
            Col("DDTree max", "num", justify="right", drop=last + 1),
            Col("evaluated", "num", justify="right", drop=last + 2),
        ],
    )
    head = registry.headline()
    for r in listing.runs:
        got, dd = summary.values(r), list(summary.budget_values(r, head).items())
        table.row(
            r.run_id,
            fmt(r.step),
            *[summary.shown(m, got[m.name]) for m in cols],
            f"{dd[-1][0]}: {summary.shown(head, dd[-1][1])}" if dd else "-",
            res.format_time(r.created)[5:16],
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
    found = {f.name for f in registry.findings()}
    for row in c.rows:
        if row["name"] not in found:
            t.row(row["label"], *[summary.shown(row["style"], v) for v in row["values"]])
    show(t)
    for row in c.rows:  # a finding is a sentence: a line per run, wrapped, never a cell
        if row["name"] in found:
            for i, line in enumerate(row["values"]):
                shown = line if line is not None else "-"
                _line(f"{row['label']} ({_label(i)}): {shown}", soft_wrap=False)
    for i, p in enumerate(c.paired, 1):
        render_paired(p, _label(i), _label(0))
    if c.plot_asked and c.plot is None:
        console.print("no plot: none of these runs carries a training step")
    elif c.plot:
        _line(f"plot: {c.plot}")
    if c.gate is not None and c.gate.passed:
        console.print(f"[bold green]{plain(c.gate.line)}[/]", soft_wrap=True)


def gate_exit(c: catalog.Comparison) -> None:
    """A failed CI gate: its one line on stderr and exit 1 (with or without --json)."""
    if c.gate is not None and not c.gate.passed:
        exit_with(1, f"[bold red]{plain(c.gate.line)}[/]")


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
            d.label,
            fmt(d.mean_a),
            fmt(d.mean_b),
            Text(f"{d.delta:+.3f}", style=colour),
            f"[{d.low:+.3f}, {d.high:+.3f}]",
            pct(d.improved),
            pct(d.worse),
        )
    show(t)
    if p.pairing != "samples":
        console.print(f"{b} vs {a}: {cmp.PAIRINGS[p.pairing]}", soft_wrap=True)
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
