"""tau by category and by completion length, as tables: one run's groups
(`orchestrator.results.breakdown`) and a paired comparison's delta per group."""

from __future__ import annotations

from rich.text import Text

from orchestrator.commands.output.base import fmt, show
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import breakdown
from orchestrator.results import compare as cmp


def render_breakdown(groups: dict[str, list[dict]]) -> None:
    """One table per axis of a run's breakdown (`breakdown.breakdown`) that has two groups
    or more (`breakdown.worth_showing`): samples, tau both ways and DDTree tau per budget,
    per group."""
    groups = breakdown.worth_showing(groups)
    for axis in breakdown.AXES:
        rows = groups.get(axis) or []
        if not rows:
            continue
        budgets = list(dict.fromkeys(b for g in rows for b in g["ddtree"]))
        t = Grid(
            breakdown.TITLES[axis],
            [
                Col("group", "id"),
                Col("samples", "num", justify="right"),
                Col("tau", "num", justify="right"),
                Col("tau (tokens)", "num", justify="right", drop=len(budgets) + 1),
                *[
                    Col(f"DDTree-{b}", "num", justify="right", drop=len(budgets) + 1 - i)
                    for i, b in enumerate(budgets)
                ],
            ],
            compact=False,
        )
        for g in rows:
            t.row(
                g["name"],
                fmt(g["samples"]),
                fmt(g["tau"]),
                fmt(g["tau_tokens"]),
                *[fmt(g["ddtree"].get(b)) for b in budgets],
            )
        show(t)


def render_group_deltas(p: cmp.Paired, b: str, a: str) -> None:
    """A paired comparison's tau delta per group (`compare.group_deltas`), with its
    interval, one table per axis of two groups or more (the DDTree budgets per group, and
    every axis: ``--json``)."""
    for axis in breakdown.AXES:
        groups = [g for g in p.groups if g.axis == axis]
        if len(groups) < 2:
            continue
        t = Grid(
            f"{b} vs {a}, {breakdown.TITLES[axis]}: paired tau delta "
            f"({p.confidence:.0%} bootstrap interval)",
            [
                Col("group", "id"),
                Col("paired", "num", justify="right"),
                Col(a, "num", justify="right"),
                Col(b, "num", justify="right"),
                Col("delta", "num", justify="right"),
                Col("interval", "num", justify="right"),
            ],
        )
        for g in groups:
            d = next((d for d in g.deltas if d.metric == "tau"), None)
            if d is None:
                t.row(g.name, fmt(g.samples), "-", "-", "-", "-")
                continue
            colour = "green" if d.low > 0 else "red" if d.high < 0 else ""
            t.row(
                g.name,
                fmt(g.samples),
                fmt(d.mean_a),
                fmt(d.mean_b),
                Text(f"{d.delta:+.3f}", style=colour),
                f"[{d.low:+.3f}, {d.high:+.3f}]",
            )
        show(t)
