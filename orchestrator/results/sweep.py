"""A temperature sweep (`remote-eval --temperature 0,0.6,1.0`): one complete run per
temperature, linked by a sweep folder's ``sweep.json`` (tau, token-weighted tau and the
interval per temperature) and ``tau_by_temperature.png`` (docs/eval.md, "Sweeps")."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.results import plots, settings, summary
from orchestrator.results import store as res
from orchestrator.results.bootstrap import bootstrap_interval
from remote.atomic import write_json_atomic
from remote.protocol import metrics as registry
from remote.protocol.metrics import HEADLINE
from remote.protocol.values import is_number

SWEEP_SCHEMA = "dflash.sweep/1"
SWEEP_FILE = "sweep.json"
SWEEP_PLOT = "tau_by_temperature.png"
TOKEN_WEIGHTED = "tau_token_weighted"


@dataclass
class Sweep:
    """A sweep folder and its ``sweep.json``."""

    path: Path
    doc: dict

    @property
    def sweep_id(self) -> str:
        return self.path.name

    @property
    def rows(self) -> list[dict]:
        return self.doc["runs"]


def temperature(run: res.Run) -> float:
    """The temperature the run's ground truth was sampled at and its tau computed for."""
    given = run.spec.get("sampling")  # spec.json is a host's word: any JSON
    t = given.get("temperature") if isinstance(given, dict) else None
    return float(t) if is_number(t) else 0.0


def row(run: res.Run) -> dict[str, Any]:
    """One temperature's line: its run, tau with its 95% bootstrap interval over samples,
    token-weighted tau; above 0 the ``expected`` block's (one walk is one draw)."""
    exp = run.result.get("expected")
    recs = res.records(run)
    if isinstance(exp, dict):
        tau, tokens = exp.get("tau"), exp.get("tau_token_weighted")
        per = [r["expected"]["tau"] for r in recs if isinstance(r.get("expected"), dict)]
    else:
        got, head = summary.values(run), registry.headline()
        tau, tokens = got.get(HEADLINE), got.get(TOKEN_WEIGHTED)
        per = [head.per_sample(r) for r in recs]
    per = [v for v in per if is_number(v)]
    return {
        "temperature": temperature(run),
        "run_id": run.run_id,
        "sampling": settings.sampling(run),
        "samples": len(per),
        "tau": tau,
        "tau_interval": list(bootstrap_interval(per)) if per else None,
        "tau_token_weighted": tokens,
    }


def write_sweep(runs: list[res.Run], root: Path, sweep_id: str) -> Sweep:
    """``root/sweep_id`` with ``sweep.json`` (a row per run, in temperature order) and the
    plot of tau against temperature; the `Sweep`."""
    folder = Path(root) / sweep_id
    folder.mkdir(parents=True, exist_ok=True)
    rows = sorted((row(r) for r in runs), key=lambda r: r["temperature"])
    doc = {
        "schema": SWEEP_SCHEMA,
        "created": time.time(),
        "checkpoint": runs[0].checkpoint if runs else None,
        "runs": rows,
    }
    write_json_atomic(folder / SWEEP_FILE, doc)
    sweep = Sweep(folder, doc)
    plot(sweep)
    return sweep


def figure(sweep: Sweep) -> Any | None:
    """tau (with its interval) and token-weighted tau against temperature."""
    plt = plots.pyplot()
    if plt is None or not sweep.rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ts = [r["temperature"] for r in sweep.rows]
    taus = [r["tau"] for r in sweep.rows]
    lo = [r["tau"] - r["tau_interval"][0] if r["tau_interval"] else 0 for r in sweep.rows]
    hi = [r["tau_interval"][1] - r["tau"] if r["tau_interval"] else 0 for r in sweep.rows]
    ax.errorbar(ts, taus, yerr=[lo, hi], marker="o", capsize=4, label="tau (95% interval)")
    ax.plot(ts, [r["tau_token_weighted"] for r in sweep.rows], "s--", label="tau token-weighted")
    ax.set_xlabel("temperature")
    ax.set_ylabel("tau (tokens per round)")
    ax.set_title(plots.text(f"{sweep.doc.get('checkpoint') or ''}: tau by temperature"))
    ax.legend()
    fig.tight_layout()
    return fig


def plot(sweep: Sweep) -> Path | None:
    """`figure` as the sweep folder's PNG."""
    fig = figure(sweep)
    return plots.save_png(fig, sweep.path / SWEEP_PLOT) if fig is not None else None


def is_sweep(folder: Path) -> bool:
    return (folder / SWEEP_FILE).is_file() and not (folder / "result.json").exists()


def load(folder: Path) -> Sweep:
    """The sweep in `folder`, its ``sweep.json`` checked (one line when damaged)."""
    try:
        doc = json.loads((folder / SWEEP_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise DflashError(f"{folder / SWEEP_FILE} cannot be read: {exc}") from None
    keys = ("temperature", "run_id", "tau", "tau_token_weighted", "tau_interval")
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != SWEEP_SCHEMA
        or not isinstance(doc.get("runs"), list)
        or not all(isinstance(r, dict) and all(k in r for k in keys) for r in doc["runs"])
    ):
        raise DflashError(f"{folder / SWEEP_FILE} is not a dflash sweep ({SWEEP_SCHEMA})")
    return Sweep(folder, doc)


def list_sweeps(root: Path) -> list[Sweep]:
    """Every readable sweep folder of the results folder `root`, oldest first."""
    if not Path(root).is_dir():
        return []
    found = []
    for p in sorted(Path(root).iterdir()):
        if not p.name.startswith(".") and is_sweep(p):
            try:
                found.append(load(p))
            except DflashError:
                continue
    return sorted(found, key=lambda s: (s.doc.get("created") or 0, s.sweep_id))


def to_json(sweep: Sweep) -> dict:
    return {"sweep_id": sweep.sweep_id, "path": str(sweep.path), **sweep.doc}
