"""Plots of results (matplotlib Agg) as PNG or report SVG; none without the ``plot`` extra."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.printable import printable
from orchestrator.results import speedup, summary
from orchestrator.results import store as res
from remote.protocol import metrics as registry
from remote.protocol.metrics import HEADLINE

DDTREE_MARKERS = ("s", "^", "v", "D", "P", "X")


MISSING = (
    "plots skipped: matplotlib is not installed (pip install matplotlib, or bash scripts/setup.sh)"
)
_told = False


def pyplot():
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


def warm() -> None:
    """Import matplotlib now, silently (from a background thread while a job runs)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        pyplot()


def text(value: object) -> str:
    """A name as matplotlib text, never mathtext: ``$`` and controls escaped."""
    return printable(str(value)).replace("$", r"\$")


def _title(run: res.Run) -> str:
    return text(f"{run.checkpoint} ({run.run_id})")


def keyed_figure(run: res.Run, name: str) -> Any | None:
    """A per-key registry metric against its key; None without data."""
    m = registry.find(name)
    rows = [r for r in summary.keyed_rows(run, name) if r["value"] is not None]
    plt = pyplot() if rows else None
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    if m.group_name:
        _grouped_lines(ax, m, summary.keyed_rows(run, name))
    elif m.reduce == registry.SUM:
        xs = [int(r["key"]) for r in rows]
        bars = ax.bar(xs, [s or 0 for s in summary.shares(rows)], color="#4C72B0")
        for x, bar in zip(xs, bars, strict=True):
            bar.set_gid(f"data-{name}-{x}")
        ax.set_ylabel(f"share of {m.num_name}")
    else:
        _rate_line(ax, m, rows)
    xs = sorted({int(r["key"]) for r in rows})
    if m.span is not None and not m.group_name:
        from remote.protocol.context import FIRST, bucket

        ax.set_xscale("symlog", base=2, linthresh=FIRST)
        doublings = [0, *(FIRST << i for i in range(max(xs).bit_length()))]
        xs = [x for x in doublings if bucket(min(xs)) <= x <= max(xs)]
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel(m.key_name)
    got = summary.values(run)
    stats = ", ".join(
        f"{m2.header} {m2.text(got[m2.name])}"
        for m2 in summary.columns([got])
        if m2.style != "count"
    )
    ax.set_title(f"{text(m.label)}: {_title(run)}\n{text(stats)}", fontsize=9)
    return fig


def _rate_line(ax: Any, m: registry.Keyed, rows: list[dict]) -> None:
    xs, ys = [int(r["key"]) for r in rows], [r["value"] for r in rows]
    (line,) = ax.plot(xs, ys, marker="o")
    line.set_gid(f"data-{m.name}")
    for x, y, r in zip(xs, ys, rows, strict=True):
        if r["den"] is not None:
            where = {"textcoords": "offset points", "xytext": (0, 7), "ha": "center"}
            ax.annotate(f"n={r['den']}", (x, y), fontsize=7, color="#555555", **where)
    if m.style == "share":
        ax.set_ylim(0, 1.12)
    ax.set_ylabel(f"{m.num_name} / {m.den_name}")
    ax.grid(alpha=0.3)


def _grouped_lines(ax: Any, m: registry.Keyed, rows: list[dict]) -> None:
    value = summary.shares(rows) if m.reduce == registry.SUM else [r["value"] for r in rows]
    lines: dict = {}
    for r, v in zip(rows, value, strict=True):
        if v is not None:
            lines.setdefault(r["group"], []).append((int(r["key"]), v))
    for i, (group, xy) in enumerate(sorted(lines.items())):
        (line,) = ax.plot(*zip(*xy, strict=True), marker="o", color=f"C{i % 10}")
        line.set_label(f"{m.group_name} {group}")
        line.set_gid(f"data-{m.name}-{group}")
    if m.reduce == registry.SUM or m.style == "share":
        ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"share of {m.num_name}" if m.reduce == registry.SUM else m.header)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def breakdown_figure(run: res.Run) -> Any | None:
    """tau per group, a panel per axis worth showing; None without one."""
    from orchestrator.results import breakdown

    groups = breakdown.worth_showing(breakdown.of_run(run))
    axes = [a for a in breakdown.AXES if a in groups]
    if not axes:
        return None
    plt = pyplot()
    if plt is None:
        return None
    tallest = max(len(groups[a]) for a in axes)
    fig, panels = plt.subplots(
        1, len(axes), figsize=(4.2 * len(axes), 1.6 + 0.32 * tallest), layout="constrained"
    )
    for ax, axis in zip(panels if len(axes) > 1 else [panels], axes, strict=True):
        rows = groups[axis]
        ys = list(range(len(rows)))[::-1]
        taus = [g[HEADLINE] or 0.0 for g in rows]
        bars = ax.barh(ys, taus, color="#4C72B0")
        for i, (bar, g) in enumerate(zip(bars, rows, strict=True)):
            bar.set_gid(f"data-{axis}-{i}")
            label = "-" if g[HEADLINE] is None else f"{g[HEADLINE]:.2f}"
            ax.annotate(
                f"{label} (n={g['samples']})",
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
        ax.set_yticks(ys, [text(g["name"]) for g in rows], fontsize=7)
        ax.set_xlim(0, max(taus) * 1.35 or 1)
        ax.set_xlabel("tau (per-sample mean)")
        ax.set_title(text(breakdown.TITLES[axis]), fontsize=9)
    fig.suptitle(_title(run), fontsize=9)
    return fig


def tradeoff_figure(run: res.Run) -> Any | None:
    """DDTree's budget trade-off, the chain dotted; None without budgets."""
    t = speedup.tradeoff(run)
    if not t:
        return None
    plt = pyplot()
    if plt is None:
        return None
    rows, chain = t["budgets"], t["chain"]
    xs = [r["budget"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    right = ax.twinx()
    for gid, axis, key, style, colour, label in (
        ("tau", ax, speedup.TAU, {"marker": "o", "linestyle": "-"}, "C0", "DDTree tau"),
        ("tau-tokens", ax, speedup.TOKENS, {"linestyle": "--"}, "C0", "DDTree tau (tokens)"),
        ("speedup", right, "speedup_estimate", {"marker": "s"}, "C1", "DDTree speedup est."),
    ):
        xy = [(x, r[key]) for x, r in zip(xs, rows, strict=True) if r[key] is not None]
        if xy:
            (line,) = axis.plot(*zip(*xy, strict=True), color=colour, label=label, **style)
            line.set_gid(f"data-tradeoff-{gid}")
        ref = chain.get(key)
        if ref is not None and key != speedup.TOKENS:
            axis.axhline(
                ref,
                color=colour,
                linestyle=":",
                alpha=0.7,
                gid=f"data-chain-{gid}",
                label=label.replace("DDTree", "chain"),
            )
            if chain.get("draft_tokens") is not None:
                axis.plot([chain["draft_tokens"]], [ref], marker="*", color=colour, ms=9)
    ax.set_xlabel("DDTree node budget N (verifies N + 1 tokens; the chain: B - 1 drafts, *)")
    ax.set_ylabel("tau (mean acceptance length)", color="C0")
    right.set_ylabel("estimated speedup (x)", color="C1")
    ax.set_xticks(sorted(set(xs) | ({chain["draft_tokens"]} - {None})))
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="best")
    note = "" if rows and rows[0]["speedup_estimate"] is not None else " (no round costs)"
    ax.set_title(
        f"DDTree budget trade-off{note}, chain dotted: {_title(run)}\n{text(t['formula'])}",
        fontsize=9,
    )
    return fig


def _series(runs: list[res.Run]) -> dict[tuple, list[res.Run]]:
    out: dict[tuple, list[res.Run]] = {}
    for r in runs:
        if r.step is None or r.metrics.get(HEADLINE) is None:
            continue
        out.setdefault(res.series_key(r), []).append(r)
    for pts in out.values():
        pts.sort(key=lambda r: (r.step, r.created))
    return out


def tau_by_step_figure(runs: list[res.Run]) -> Any | None:
    """Taus per training step, a colour per series; None without steps."""
    series = _series(runs)
    if not series:
        return None
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    many = len(series) > 1
    for i, (key, pts) in enumerate(sorted(series.items())):
        steps = [r.step for r in pts]
        prefix = f"{text(res.series_label(key))}: " if many else ""
        lines: list[tuple[str, list, dict]] = [
            (
                m.header if m.name == HEADLINE else m.label,
                [m.read(r.metrics) for r in pts],
                {
                    "linestyle": m.plot,
                    **({"marker": "o"} if m.name == HEADLINE else {"alpha": 0.7}),
                },
            )
            for m in registry.scalars()
            if m.plot
        ]
        for m in summary.per_budget():
            per = [summary.budget_values(r, m) for r in pts]
            for j, b in enumerate(sorted({b for p in per for b in p}, key=summary.budget_key)):
                style = {"marker": DDTREE_MARKERS[j % len(DDTREE_MARKERS)], "markersize": 4}
                lines.append(
                    (
                        text(summary.budget_label(m, b)),
                        [p.get(b) for p in per],
                        {"linestyle": ":", **style},
                    )
                )
        for j, (name, ys, style) in enumerate(lines):
            xy = [(x, y) for x, y in zip(steps, ys, strict=False) if y is not None]
            if not xy:
                continue
            colour = f"C{i % 10}" if many else f"C{j % 10}"
            (line,) = ax.plot(
                [x for x, _ in xy], [y for _, y in xy], color=colour, label=prefix + name, **style
            )
            line.set_gid(f"data-tau-{i}-{re.sub(r'[^a-z0-9]+', '-', name.lower())}")
    ax.set_xlabel("training step")
    ax.set_ylabel("tau (mean acceptance length)")
    ax.set_title("tau per training step (DDTree: best-first tree of that many nodes)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return fig


def save_png(fig: Any, path: str | Path) -> Path:
    plt = pyplot()
    if plt is None:
        return None
    path = Path(path)
    if not path.parent.is_dir():
        plt.close(fig)
        raise DflashError(
            f"no folder {path.parent} to write {path.name} into; create it or give another path"
        )
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def svg(fig: Any, salt: str = "") -> str:
    """The figure as an inline ``<svg>``, ids salted per figure so they never clash on a page."""
    import matplotlib

    plt = pyplot()
    if plt is None:
        return None
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt or str(id(fig))}):
        fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def plot_run(run: res.Run, out_dir: str | Path | None = None) -> list[Path]:
    """One run's PNGs (per-key metrics, tau by group, DDTree trade-off where present); the files."""
    out = Path(out_dir or run.path)
    written = []
    figures = [(lambda r, n=m.name: keyed_figure(r, n), f"{m.name}.png") for m in registry.keyed()]
    figures += [(breakdown_figure, "tau_by_category.png"), (tradeoff_figure, "ddtree_tradeoff.png")]
    for make, name in figures:
        fig = make(run)
        if fig is not None:
            written.append(save_png(fig, out / name))
    return written


def plot_tau_by_step(runs: list[res.Run], path: str | Path) -> Path | None:
    """`tau_by_step_figure` as a PNG at `path`; None (nothing written) when no run has a step."""
    fig = tau_by_step_figure(runs)
    return save_png(fig, path) if fig is not None else None
