"""A temperature sweep as people read it: a line per temperature (tau with its interval,
token-weighted tau, the run), the plot and the folder (`results show SWEEP`, `results list`)."""

from __future__ import annotations

from orchestrator.commands.output.base import console, fmt, plain, show
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import sweep as view


def sweep_table(sweeps: list[view.Sweep]) -> None:
    """`results list`'s sweeps: each by its id, its temperatures and its runs."""
    t = Grid("temperature sweeps", [Col("sweep", "id"), Col("temperatures"), Col("tau")])
    for s in sweeps:
        t.row(
            s.sweep_id,
            ", ".join(f"{r['temperature']:g}" for r in s.rows),
            ", ".join(fmt(r["tau"]) for r in s.rows),
        )
    show(t)


def render_sweep(sweep: view.Sweep) -> None:
    """One sweep: tau against temperature, then where its plot and runs are."""
    t = Grid(
        f"tau by temperature: {sweep.doc.get('checkpoint') or '-'}",
        [
            Col("T", "num", justify="right"),
            Col("tau", "num", justify="right"),
            Col("95% interval", "num", justify="right"),
            Col("tau tok", "num", justify="right"),
            Col("samples", "num", justify="right"),
            Col("run", "id"),
        ],
    )
    for r in sweep.rows:
        lo_hi = r["tau_interval"]
        t.row(
            f"{r['temperature']:g}",
            fmt(r["tau"]),
            f"{fmt(lo_hi[0])} - {fmt(lo_hi[1])}" if lo_hi else "-",
            fmt(r["tau_token_weighted"]),
            fmt(r.get("samples")),
            r["run_id"],
        )
    show(t)
    plot = sweep.path / view.SWEEP_PLOT
    if plot.is_file():
        console.print(plain(f"plot: {plot}"), soft_wrap=True)
    console.print(plain(f"sweep: {sweep.path}"), soft_wrap=True)
