"""The speedup estimate for people: its summary line and DDTree's trade-off table (ms)."""

from __future__ import annotations

from typing import Any

from orchestrator.commands.output.base import fmt
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import speedup
from orchestrator.results import store as res


def speedup_line(run: res.Run) -> str:
    """The estimates with their spread ranges, chain then budgets; or why withheld."""
    est = speedup.estimate(run)
    if not est:
        return "- (no round costs recorded)"
    if "withheld" in est:
        return est["withheld"]
    ends = speedup.estimate_range(run)

    def shown(value: Any, span: tuple | None) -> str:
        if span is None or None in span or span[0] == span[1]:
            return f"{fmt(value, 2)}x"
        return f"{fmt(value, 2)}x ({fmt(span[0], 2)}-{fmt(span[1], 2)})"

    parts = [shown(est["chain"], ends.get("chain"))]
    parts += [
        f"DDTree-{b} {shown(v, ends.get('ddtree', {}).get(b))}" for b, v in est["ddtree"].items()
    ]
    if once := speedup.timed_once(run):
        parts.append(f"timed once, no spread: {', '.join(once)}")
    return "; ".join(parts)


def ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3f}"


def speedup_x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


# How each of `speedup.TRADEOFF_COLUMNS` looks here: its kind, rank for leaving it out
# when the table is too wide, and its cell format.
LOOK = (
    ("num", 0, fmt),
    ("num", 3, fmt),
    ("num", 0, fmt),
    ("num", 0, fmt),
    ("num", 2, fmt),
    ("num", 0, ms),
    ("id", 1, fmt),
    ("num", 0, speedup_x),
)


def tradeoff_table(trade: dict) -> Grid:
    """DDTree's trade-off per node budget (`speedup.tradeoff`), the chain last."""
    t = Grid(
        f"DDTree budgets: tau and speedup estimate ({trade['formula']}; "
        f"t_step {ms(trade['target_step_s'])} ms, t_draft {ms(trade['drafter_round_s'])} ms)",
        [
            Col(name, kind, justify="right" if kind == "num" else "left", drop=drop)
            for name, (kind, drop, _cell) in zip(speedup.TRADEOFF_COLUMNS, LOOK, strict=True)
        ],
        compact=False,
    )
    for row in speedup.tradeoff_rows(trade):
        t.row(*(cell(v) for (_k, _d, cell), v in zip(LOOK, row, strict=True)))
    return t
