"""tau by category and completion length as tables: a run's groups, a comparison's deltas."""

from __future__ import annotations

from rich.text import Text

from orchestrator.commands.output.base import fmt, show
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import breakdown, summary
from orchestrator.results import compare as cmp
from remote.protocol import metrics as registry


def render_breakdown(groups: dict[str, list[dict]]) -> None:
    """A table per breakdown axis worth showing: each table metric and the headline per budget."""
    groups = breakdown.worth_showing(groups)
    cols = summary.columns(g for rows in groups.values() for g in rows)
    head = registry.headline()
    for axis in breakdown.AXES:
        rows = groups.get(axis) or []
        if not rows:
            continue
        budgets = list(dict.fromkeys(b for g in rows for b in g["ddtree"]))
        n = len(budgets)
        t = Grid(
            breakdown.TITLES[axis],
            [
                Col("group", "id"),
                *[
                    Col(m.header, "num", justify="right", drop=m.rank + n if m.rank else 0)
                    for m in cols
                ],
                *[
                    Col(summary.budget_label(head, b), "num", justify="right", drop=n - i)
                    for i, b in enumerate(budgets)
                ],
            ],
            compact=False,
        )
        for g in rows:
            t.row(
                g["name"],
                *[summary.shown(m, g[m.name]) for m in cols],
                *[summary.shown(head, g["ddtree"].get(b)) for b in budgets],
            )
        show(t)


def render_group_deltas(p: cmp.Paired, b: str, a: str) -> None:
    """A comparison's paired tau delta per group with its interval, a table per axis."""
    for axis, title in cmp.axes():
        groups = [g for g in p.groups if g.axis == axis]
        if len(groups) < 2:
            continue
        t = Grid(
            f"{b} vs {a}, {title}: paired tau delta ({p.confidence:.0%} bootstrap interval)",
            [
                Col("group", "id"),
                Col("paired", "num", justify="right"),
                Col(a, "num", justify="right", drop=2),
                Col(b, "num", justify="right", drop=1),
                Col("delta", "num", justify="right"),
                Col("interval", "num", justify="right"),
            ],
        )
        for g in groups:
            d = cmp.group_lead(g)
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
