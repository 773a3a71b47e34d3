"""Parity runs in the results folder: read, summed up, per-layer rows and plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError
from remote.protocol import PARITY_SCHEMA


def side_label(result: dict, side: str) -> str:
    """``host (dtype, device, attn)`` of one side."""
    cap = (result.get("captures") or {}).get(side) or {}
    dev = (cap.get("device") or {}).get("device", "?")
    attn = cap.get("attn") or "default"
    host = (result.get("hosts") or {}).get(side) or cap.get("host") or side.upper()
    return f"{host} ({cap.get('dtype', '?')}, {dev}, {attn})"


def summary(result: dict, run_id: str = "") -> dict[str, Any]:
    """The headline numbers of a parity run (what `results list` shows)."""
    layers = result.get("layers") or []
    worst = max(layers, key=lambda r: r["rel_l2"]["p99"]) if layers else None
    d = result.get("drafter") or {}
    return {
        "run_id": run_id,
        "kind": "parity",
        "a": side_label(result, "a"),
        "b": side_label(result, "b"),
        "samples": result.get("samples"),
        "identical": result.get("identical"),
        "worst_layer": worst["layer"] if worst else None,
        "worst_rel_l2_p99": worst["rel_l2"]["p99"] if worst else None,
        "min_cosine": min((r["cosine"]["min"] for r in layers), default=None),
        "top1_agreement": (result.get("top1_agreement") or {}).get("rate"),
        "tau_a": d.get("tau_a"),
        "tau_b": d.get("tau_b"),
        "delta_tau": d.get("delta_tau"),
        "created": result.get("created"),
    }


def layer_rows(result: dict) -> list[list[str]]:
    """One row per layer: layer, cosine p50/p1/min, rel L2 p50/p99/max, max abs p99/max."""
    rows = []
    for r in result.get("layers") or []:
        c, e, m = r["cosine"], r["rel_l2"], r["max_abs"]
        rows.append(
            [
                str(r["layer"]),
                f"{c['p50']:.6f}",
                f"{c['p1']:.6f}",
                f"{c['min']:.6f}",
                f"{e['p50']:.2e}",
                f"{e['p99']:.2e}",
                f"{e['max']:.2e}",
                f"{m['p99']:.2e}",
                f"{m['max']:.2e}",
            ]
        )
    return rows


LAYER_COLUMNS = (
    "layer",
    "cos p50",
    "cos p1",
    "cos min",
    "relL2 p50",
    "relL2 p99",
    "relL2 max",
    "maxabs p99",
    "maxabs max",
)


def plot_layers(result: dict, path: str | Path) -> Path | None:
    """Relative L2 error (p50, p99, max over tokens) per layer, log scale; None without
    matplotlib (after the one line `orchestrator.plots` prints)."""
    from orchestrator.results import plots

    plt = plots.pyplot()
    layers = result.get("layers") or []
    if plt is None or not layers:
        return None
    xs = [r["layer"] for r in layers]
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    floor = 1e-12  # identical layers (error 0) drawn on the floor of the log axis
    for key, style in (("p50", "o-"), ("p99", "s--"), ("max", "^:")):
        ax.plot(
            xs,
            [max(r["rel_l2"][key], floor) for r in layers],
            style,
            label=f"relative L2, {key} over tokens",
        )
    ax.set_yscale("log")
    ax.set_xlabel("target layer")
    ax.set_ylabel("|a - b| / |a|")
    d = result.get("drafter") or {}
    title = plots.text(f"{side_label(result, 'a')} vs {side_label(result, 'b')}")
    if d:
        title += f"\ntau A {d['tau_a']:.3f}, tau B {d['tau_b']:.3f}, delta {d['delta_tau']:+.3f}"
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return plots.save_png(fig, path)


def load(path: str | Path) -> dict:
    """A parity run's result.json, or one line when it is not one."""
    path = Path(path)
    try:
        result = json.loads((path / "result.json").read_text())
    except (OSError, ValueError):
        raise DflashError(f"no readable result.json in {path}") from None
    if not str(result.get("schema", "")).startswith(PARITY_SCHEMA.split("/")[0] + "/"):
        raise DflashError(f"{path} is not a parity run")
    return result


def is_parity_run(path: Path) -> bool:
    try:
        load(path)
        return True
    except DflashError:
        return False


def list_runs(root: str | Path) -> list[tuple[Path, dict]]:
    """Parity runs under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if not p.name.startswith(".") and (p / "result.json").is_file():
            try:
                out.append((p, load(p)))
            except DflashError:
                continue
    return sorted(out, key=lambda pr: (pr[1].get("created") or 0, pr[0].name))
