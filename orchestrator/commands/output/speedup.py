"""How the speedup estimate looks to people: its line in a run's summary and DDTree's
budget trade-off table (`orchestrator.results.speedup`), times in milliseconds."""

from __future__ import annotations

from typing import Any

from orchestrator.commands.output.base import fmt
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import speedup
from orchestrator.results import store as res


def speedup_line(run: res.Run) -> str:
    """The speedup estimates: the chain's, then each DDTree budget's."""
    est = speedup.estimate(run)
    if not est:
        return "- (no round costs recorded)"
    parts = [f"{fmt(est['chain'], 2)}x"]
    parts += [f"DDTree-{b} {fmt(v, 2)}x" for b, v in est["ddtree"].items()]
    return "; ".join(parts)


def ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3f}"


def tradeoff_table(run: res.Run, trade: dict) -> Grid:
    """The DDTree budgets (`speedup.tradeoff`): tau, verify cost and speedup estimate per
    node budget, and the chain walk's as the last row."""
    dd = run.metrics.get("ddtree") or {}
    t = Grid(
        f"DDTree budgets: tau and speedup estimate ({trade['formula']}; "
        f"t_step {ms(trade['target_step_s'])} ms, t_draft {ms(trade['drafter_round_s'])} ms)",
        [
            Col("budget (nodes)", "num", justify="right"),
            Col("per-depth top-k", "num", justify="right", drop=3),
            Col("tau", "num", justify="right"),
            Col("tau (tokens)", "num", justify="right"),
            Col("rounds", "num", justify="right", drop=2),
            Col("verify (ms)", "num", justify="right"),
            Col("verify mask", "id", drop=1),
            Col("speedup est.", "num", justify="right"),
        ],
        compact=False,
    )
    for r in trade["budgets"]:
        v = dd.get(str(r["budget"])) or {}
        t.row(
            str(r["budget"]),
            fmt(v.get("topk")),
            fmt(r["tau"]),
            fmt(r["tau_tokens"]),
            fmt(v.get("rounds")),
            ms(r["verify_s"]),
            fmt(r["verify_mask"]),
            "-" if r["speedup_estimate"] is None else f"{r['speedup_estimate']:.2f}x",
        )
    c = trade["chain"]
    t.row(
        f"chain ({fmt(c['draft_tokens'])} drafts)",
        "-",
        fmt(c["tau"]),
        fmt(c["tau_tokens"]),
        fmt(run.metrics.get("rounds")),
        ms(c["verify_s"]),
        "causal" if c["verify_s"] is not None else "-",
        "-" if c["speedup_estimate"] is None else f"{c['speedup_estimate']:.2f}x",
    )
    return t
