"""How `dflash parity` looks to people, and its ``--json`` forms."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.output.base import console, plain, show
from orchestrator.commands.output.tables import Col, Grid
from orchestrator.results import parity_view


def parity_json(run_dir: Path) -> dict:
    """`parity --json` after a comparison: the run, its summary and its result."""
    result = _parity_result(run_dir)
    return {
        "run_dir": str(run_dir),
        "run_id": run_dir.name,
        "summary": parity_view.summary(result, run_dir.name),
        "result": result,
    }


def parity_attach_json(run_dir: Path) -> dict:
    """`jobs attach --json` of a parity compare job: the run folder and its result."""
    return {"run_dir": str(run_dir), "result": _parity_result(run_dir)}


def render_parity_run(run_dir: Path) -> None:
    """The parity table of the run in `run_dir`."""
    render_parity(_parity_result(run_dir), run_dir)


def _parity_result(run_dir: Path) -> dict:
    return parity_view.load(run_dir)


def render_parity(result: dict, run_dir: Path) -> None:
    """The parity table: sides, per-layer errors, top-1 agreement, tau A/B."""
    console.print(f"A: {plain(parity_view.side_label(result, 'a'))}", soft_wrap=True)
    console.print(f"B: {plain(parity_view.side_label(result, 'b'))}", soft_wrap=True)
    for side in ("a", "b"):
        k = ((result.get("captures") or {}).get(side) or {}).get("kernels") or {}
        console.print(
            f"  kernels on {side.upper()}: "
            + plain(", ".join(f"{n} {v.get('version') or 'absent'}" for n, v in k.items())),
            soft_wrap=True,
        )
    tokens = (result.get("layers") or [{}])[0].get("tokens", "?")
    t = Grid(
        f"features per layer ({result.get('samples')} samples, {tokens} tokens; A = reference)",
        [
            Col(name, "num", justify="right", drop=LAYER_DROP.get(name, 0))
            for name in parity_view.LAYER_COLUMNS
        ],
    )
    for row in parity_view.layer_rows(result):
        t.row(*row)
    show(t)
    top1 = result.get("top1_agreement") or {}
    rate = top1.get("rate")
    console.print(
        f"top-1 agreement of the logits: {top1.get('match')}/{top1.get('total')}"
        + (f" ({rate:.2%})" if rate is not None else "")
    )
    d = result.get("drafter")
    if d:
        console.print(
            f"drafter {plain(d['path'])} (layers {plain(d['target_layer_ids'])}):  tau A "
            f"{d['tau_a']:.4f}  tau B {d['tau_b']:.4f}  delta tau (B - A) "
            f"{d['delta_tau']:+.4f}  samples diverging {d['samples_diverging']}/"
            f"{len(d['per_sample'])}",
            soft_wrap=True,
        )
    if result.get("identical"):
        console.print("[green]identical: the hosts compute the same features bit for bit[/]")
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    console.print(plain(f"results: {run_dir}" + (f"  plot: {', '.join(pngs)}" if pngs else "")))


# Left out first when the table is too wide: the tails that repeat what the others show.
LAYER_DROP = {"cos p1": 4, "relL2 max": 3, "maxabs p99": 2, "relL2 p50": 1}
