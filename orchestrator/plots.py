"""PNG plots of results, drawn with matplotlib's Agg backend (no display needed).

`plot_run` writes ``acceptance_histogram.png`` and ``per_position_acceptance.png`` beside a
run's JSON; `plot_tau_by_step` draws tau against the checkpoint's training step for many
runs, one line per series (same drafter folder, prompts and ground truth), so a team sees
whether a training run is still improving.

matplotlib is the optional ``plot`` extra: without it every plot is skipped (the JSON
results are complete without them) and one line says so, once per process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator import results as res

MISSING = ("plots skipped: matplotlib is not installed "
           "(pip install 'dflash[plot]', or bash scripts/setup.sh)")
_told = False


def _pyplot():
    """pyplot on the Agg backend, or None (after one line on stderr) without matplotlib."""
    global _told
    try:
        import matplotlib
    except ImportError:
        if not _told:
            print(MISSING, file=sys.stderr)
            _told = True
        return None

    matplotlib.use("Agg")  # files only, never a window; must precede pyplot's import
    import matplotlib.pyplot as plt

    return plt


def plot_run(run: res.Run, out_dir: str | Path | None = None) -> list[Path]:
    """Acceptance histogram and per-position acceptance of one run; returns the files."""
    plt = _pyplot()
    if plt is None:
        return []
    out = Path(out_dir or run.path)
    written = []
    title = f"{run.checkpoint} ({run.run_id})"

    hist = res.histogram(run)
    if hist:
        total = sum(c for _, c in hist) or 1
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar([k for k, _ in hist], [c / total for _, c in hist], color="#4C72B0")
        tau = run.metrics.get("tau_token_weighted")
        ax.set_xlabel("acceptance length (accepted draft tokens + 1)")
        ax.set_ylabel("share of rounds")
        ax.set_xticks([k for k, _ in hist])
        ax.set_title(f"acceptance histogram: {title}" + (f"  tau={tau:.3f}" if tau else ""),
                     fontsize=9)
        fig.tight_layout()
        path = out / "acceptance_histogram.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    pos = [p for p in res.per_position(run) if p.get("rate") is not None]
    if pos:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([p["position"] for p in pos], [p["rate"] for p in pos], marker="o")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("draft position j")
        ax.set_ylabel("P(position j correct | 1..j-1 correct)")
        ax.set_title(f"per-position acceptance: {title}", fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / "per_position_acceptance.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def series_key(run: res.Run) -> str:
    """Runs on one line of the tau-by-step plot: same drafter folder, prompts, ground truth."""
    drafter = str(run.spec.get("drafter") or "")
    parent = Path(drafter).parent.name or "drafters"
    prompts = (run.spec.get("prompts") or {}).get("name") or "-"
    gt = res.ground_truth_source(run).get("kind") or "-"
    return f"{parent} / {prompts} / {gt}"


def plot_tau_by_step(runs: list[res.Run], path: str | Path) -> Path | None:
    """Tau (z-lab's per-sample mean, solid; token-weighted, dashed) per checkpoint step,
    one colour per series. Runs whose checkpoint carries no step are left out; returns
    None when no run has one (or without matplotlib)."""
    points: dict[str, list[tuple[int, float, float | None]]] = {}
    for r in runs:
        tau = r.metrics.get("tau_per_sample_mean")
        if r.step is None or tau is None:
            continue
        points.setdefault(series_key(r), []).append(
            (r.step, float(tau), r.metrics.get("tau_token_weighted")))
    plt = _pyplot() if points else None
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (key, pts) in enumerate(sorted(points.items())):
        pts.sort()
        colour = f"C{i % 10}"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colour,
                label=f"{key} (tau)")
        tw = [(p[0], p[2]) for p in pts if p[2] is not None]
        if tw:
            ax.plot([p[0] for p in tw], [p[1] for p in tw], linestyle="--", color=colour,
                    alpha=0.6, label=f"{key} (token-weighted)")
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel("tau (mean acceptance length)")
    ax.set_title("tau per checkpoint step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
