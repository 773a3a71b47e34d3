"""How `dflash parity` looks to people: the sides, per-layer errors, top-1 agreement and
tau A/B; and its ``--json`` forms."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from orchestrator.commands.output.base import console
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
    """`parity --attach --json`: the run folder and its result."""
    return {"run_dir": str(run_dir), "result": _parity_result(run_dir)}


def render_parity_run(run_dir: Path) -> None:
    """The parity table of the run in `run_dir`."""
    render_parity(_parity_result(run_dir), run_dir)


def _parity_result(run_dir: Path) -> dict:
    from orchestrator.eval import parity

    return parity.load(run_dir)


def render_parity(result: dict, run_dir: Path) -> None:
    """The parity table: sides, per-layer errors, top-1 agreement, tau A/B."""
    console.print(f"A: {parity_view.side_label(result, 'a')}")
    console.print(f"B: {parity_view.side_label(result, 'b')}")
    for side in ("a", "b"):
        k = ((result.get("captures") or {}).get(side) or {}).get("kernels") or {}
        console.print(
            f"  kernels on {side.upper()}: "
            + ", ".join(f"{n} {v.get('version') or 'absent'}" for n, v in k.items())
        )
    tokens = (result.get("layers") or [{}])[0].get("tokens", "?")
    t = Table(
        title=f"features per layer ({result.get('samples')} samples, {tokens} tokens; "
        "A = reference)"
    )
    for col in parity_view.LAYER_COLUMNS:
        t.add_column(col, justify="right")
    for row in parity_view.layer_rows(result):
        t.add_row(*row)
    console.print(t)
    top1 = result.get("top1_agreement") or {}
    rate = top1.get("rate")
    console.print(
        f"top-1 agreement of the logits: {top1.get('match')}/{top1.get('total')}"
        + (f" ({rate:.2%})" if rate is not None else "")
    )
    d = result.get("drafter")
    if d:
        console.print(
            f"drafter {d['path']} (layers {d['target_layer_ids']}):  tau A "
            f"{d['tau_a']:.4f}  tau B {d['tau_b']:.4f}  delta tau (B - A) "
            f"{d['delta_tau']:+.4f}  samples diverging {d['samples_diverging']}/"
            f"{len(d['per_sample'])}"
        )
    if result.get("identical"):
        console.print("[green]identical: the hosts compute the same features bit for bit[/]")
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    console.print(f"results: {run_dir}" + (f"  plot: {', '.join(pngs)}" if pngs else ""))
