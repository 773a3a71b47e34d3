"""How tau per checkpoint step looks to people (follow's or the demo's), from the registry."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.output.base import console, plain, show
from orchestrator.commands.output.tables import Col, Grid, styled
from orchestrator.eval.follow import loop as follow_lib
from orchestrator.results import summary
from remote.protocol import metrics as registry


def _line(text: str) -> None:
    console.print(plain(text), soft_wrap=True)


def history_table(history: list[dict], title: str = "tau per checkpoint step") -> Grid:
    """Step, checkpoint, the registry's table metrics, the headline per DDTree budget, why a
    checkpoint failed; narrow, the non-headline metrics go first, then small budgets."""
    budgets = sorted({b for h in history for b in (h.get("ddtree") or {})}, key=int)
    failed = any(h.get("state") != "done" for h in history)
    cols, head = summary.columns(history), registry.headline()
    table = Grid(
        title,
        [
            Col("step", "num", justify="right"),
            Col("checkpoint"),
            *[
                Col(m.header, "num", justify="right", drop=m.rank + len(budgets) if m.rank else 0)
                for m in cols
            ],
            *[
                Col(
                    summary.budget_label(head, b), "num", justify="right", drop=len(budgets) + 1 - i
                )
                for i, b in enumerate(budgets, 1)
            ],
            *([Col("error")] if failed else []),
        ],
    )
    for h in sorted(history, key=lambda h: (h.get("step") is None, h.get("step") or 0)):
        lead = [str(h.get("step")), h["checkpoint"]]
        if h.get("state") != "done":
            blank = [""] * (len(cols) + len(budgets) - 1)
            table.row(*lead, styled("failed", "red"), *blank, h.get("error") or "")
            continue
        table.row(
            *lead,
            *[summary.shown(m, h.get(m.name)) for m in cols],
            *[summary.shown(head, (h.get("ddtree") or {}).get(b)) for b in budgets],
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
    setup = f"set-up {secs['setup']:.0f}s, " if "setup" in secs else ""
    _line(
        f"models: {result.models} ({'built now' if result.built_now else 'cached'})"
        f"; {secs['total']:.0f}s in all: {setup}models {secs['models']:.0f}s, hosts and "
        f"server {secs['hosts']:.0f}s, relay+probe+eval {secs['relay_probe_eval']:.0f}s"
    )
