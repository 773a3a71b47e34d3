"""A run's numbers as every view reads them, from the metric registry
(`remote.protocol.metrics`): the values of each metric, per DDTree budget and as flat
columns, how a value prints, the flat summary of a run and the rows of a comparison.
A metric added to the registry reaches every view through here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.results import settings
from orchestrator.results import store as res
from orchestrator.results.bootstrap import bootstrap_interval
from remote.protocol import metrics as registry
from remote.protocol.metrics import Metric


def budget_key(text: Any) -> float:
    """Sort key of a DDTree budget given as text (``"8"`` before ``"16"``); others last."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("inf")


def shown(m: Metric | str, value: Any) -> str:
    """`value` as metric `m` (or a style) prints (`remote.protocol.metrics.shown`)."""
    return registry.shown(m if isinstance(m, str) else m.style, value)


def columns(rows: Iterable[Mapping] = ()) -> list[Metric]:
    """The metrics a table of `rows` (by metric name) shows as columns, in `Metric.rank`
    order; a `Metric.sparse` one only where a row has its value."""
    rows = list(rows)
    return sorted(
        (
            m
            for m in registry.scalars()
            if m.rank is not None and (not m.sparse or any(r.get(m.name) is not None for r in rows))
        ),
        key=lambda m: m.rank,
    )


def per_budget() -> list[Metric]:
    """The metrics shown per DDTree budget (`Metric.budgets`)."""
    return [m for m in registry.scalars(registry.WALK) if m.budgets]


def budget_label(m: Metric, budget: str) -> str:
    return f"DDTree-{budget} {m.header}"


def values(run: res.Run) -> dict[str, Any]:
    """Each scalar metric's value in the run's result."""
    return {m.name: m.read(run.metrics) for m in registry.scalars()}


def found(run: res.Run) -> dict[str, str | None]:
    """Each finding of the registry (`Finding`) as the run's result holds it: one line,
    or None (none found, or not judged when the run was made)."""
    return {f.name: run.metrics.get(f.name) for f in registry.findings()}


def intervals(run: res.Run) -> dict[str, tuple[float, float]]:
    """The bootstrap interval over the run's samples (`bootstrap.bootstrap_interval`) of
    each metric the registry asks one for (`Metric.interval`, a mean of per-sample
    values); {} without sample records."""
    wanted = [m for m in registry.scalars() if m.interval and m.reduce == registry.MEAN]
    recs = res.records(run) if wanted else []
    out = {}
    for m in wanted:
        per = [v for v in (m.per_sample(r) for r in recs) if v is not None]
        if per:
            out[m.name] = bootstrap_interval(per)
    return out


def with_interval(m: Metric, value: Any, interval: tuple[float, float] | None) -> str:
    """A value as it prints, its interval beside it where it has one."""
    if interval is None:
        return m.text(value)
    return f"{m.text(value)} [{m.text(interval[0])}, {m.text(interval[1])}]"


def budgets(run: res.Run) -> list[str]:
    return sorted((run.metrics.get("ddtree") or {}), key=budget_key)


def budget_values(run: res.Run, m: Metric) -> dict[str, Any]:
    """A walk metric per DDTree budget of the run."""
    dd = run.metrics.get("ddtree") or {}
    return {b: m.read(dd[b] or {}) for b in budgets(run)}


def flat(run: res.Run) -> dict[str, Any]:
    """Every metric of the run as flat columns (CSV, JSON lines): its name (and
    ``<name>_low``, ``<name>_high``: `intervals`), ``<name>_ddtree_<budget>`` per DDTree
    budget, ``<name>_<key>`` per key."""
    out = {**values(run), **found(run)}
    for name, (low, high) in intervals(run).items():
        out.update({f"{name}_low": low, f"{name}_high": high})
    for m in per_budget():
        out.update({f"{m.name}_ddtree_{b}": v for b, v in budget_values(run, m).items()})
    for k in registry.keyed():
        rows = [r for r in keyed_rows(run, k.name) if r["key"] is not None]
        out.update({f"{k.name}_{key_text(r)}": r["value"] for r in rows})
    return out


def tracked(run: res.Run) -> dict[str, Any]:
    """The scalars a tracker plots: every metric but the counts by its name,
    ``<name>/ddtree_<budget>`` per budget and a per-key rate's ``<name>/<key>``."""
    out = {m.name: m.read(run.metrics) for m in registry.scalars() if m.style != "count"}
    for m in per_budget():
        out.update({f"{m.name}/ddtree_{b}": v for b, v in budget_values(run, m).items()})
    for k in registry.keyed():
        rows = [r for r in keyed_rows(run, k.name) if r["key"] is not None]
        if k.reduce == registry.RATIO:
            out.update({f"{k.name}/{key_text(r)}": r["value"] for r in rows})
    return out


def key_text(row: dict) -> str:
    """A per-key row's key in a column or tag name: ``<key>``, or ``<group>_<key>``."""
    return f"{row['group']}_{row['key']}" if "group" in row else str(row["key"])


def key_label(m: registry.Keyed, row: dict) -> str:
    """A per-key row as a comparison names it: ``<header> <key>`` (``at <group_name>
    <group>`` after it for a grouped metric)."""
    group = f" at {m.group_name} {row['group']}" if "group" in row else ""
    return f"{m.header} {row['key']}{group}"


def keyed_rows(run: res.Run, name: str) -> list[dict]:
    """A per-key metric's rows in the run (`Keyed.rows`)."""
    m = registry.find(name)
    return m.rows(run.metrics) if isinstance(m, registry.Keyed) else []


def shares(rows: list[dict]) -> list[float | None]:
    """Each row's count as a share of its group's (of all, ungrouped)."""
    totals: dict = {}
    for r in rows:
        totals[r.get("group")] = totals.get(r.get("group"), 0) + (r["num"] or 0)
    return [
        (r["num"] or 0) / totals[r.get("group")] if totals[r.get("group")] else None for r in rows
    ]


def keyed_table(run: res.Run, name: str) -> tuple[list[str], list[list[str]]]:
    """A per-key metric as every view prints it: headers and rows of text, a SUM's
    ``key, count, share`` (of its group's) and a RATIO's ``key, den, num, value``; a
    grouped metric's group first."""
    m = registry.find(name)
    rows = keyed_rows(run, name)
    group = [m.group_name] if m.group_name else []
    first = [[str(r["group"])] if m.group_name else [] for r in rows]
    if m.reduce == registry.SUM:
        return [*group, m.key_name, m.num_name, "share"], [
            [*g, str(r["key"]), shown("count", r["num"]), shown("share", s)]
            for g, r, s in zip(first, rows, shares(rows), strict=True)
        ]
    head = [*group, m.key_name, m.den_name, m.num_name, "rate" if m.style == "share" else "value"]
    return head, [
        [
            *g,
            str(r["key"]),
            shown("count", r["den"]),
            shown("count", r["num"]),
            shown(m.style, r["value"]),
        ]
        for g, r in zip(first, rows, strict=True)
    ]


def summary(run: res.Run) -> dict:
    """The headline numbers of a run, flat, for tables and scripts: every scalar metric
    by its name, the headline per DDTree budget (``ddtree``), and how it was made."""
    gt = res.ground_truth_source(run)
    head = registry.headline()
    return {
        "run_id": run.run_id,
        "checkpoint": run.checkpoint,
        "step": run.step,
        "host": run.spec.get("host") or (run.result.get("job") or {}).get("host"),
        "prompts": (run.spec.get("prompts") or {}).get("name"),
        **values(run),
        **{f"{k}_interval": list(v) for k, v in intervals(run).items()},
        **found(run),
        "ddtree": budget_values(run, head),
        "ground_truth": gt.get("kind"),
        "ground_truth_cached": gt.get("cached"),
        "features_cached": settings.target_features(run).get("cached"),
        "retokenisation_mismatch": (gt.get("retokenisation") or {}).get("mismatch_rate"),
        "dtype": settings.dtype(run),
        "speedup_estimate": speedup_estimate(run),
        "thinking": settings.thinking(run),
        "sampling": settings.sampling(run),
        "expected": run.result.get("expected"),
        "chat_template_sha256": settings.chat_template(run),
        "engine": settings.engine(run),
        "drafter_sha256": run.drafter.get("sha256"),
        "training_run": run.training_run.name,
        "trainer": run.training_run.host,
        "checkpoints_folder": run.training_run.folder,
        "created": run.created,
        "created_time": res.format_time(run.created),
    }


def speedup_estimate(run: res.Run) -> float | None:
    """The chain's speedup estimate from the host's round costs (`speedup.estimate`)."""
    from orchestrator.results import speedup

    return speedup.estimate(run).get("chain")


def compare_rows(runs: list[res.Run]) -> list[dict]:
    """Rows for a side-by-side comparison: ``{name, label, style, values}`` with a value
    per run; every metric of the registry, per DDTree budget and per key too."""
    sums = [summary(r) for r in runs]

    def row(name: str, label: str, vals: list, style: str = "text") -> dict:
        return {"name": name, "label": label, "style": style, "values": vals}

    rows = [row(k, k, [s[k] for s in sums]) for k in ("checkpoint", "step", "host", "prompts")]
    rows += [row(m.name, m.label, [s[m.name] for s in sums], m.style) for m in registry.scalars()]
    rows += [row(f.name, f.label, [s[f.name] for s in sums]) for f in registry.findings()]
    for m in per_budget():
        per = [budget_values(r, m) for r in runs]
        for b in sorted({b for p in per for b in p}, key=budget_key):
            rows.append(row(f"{m.name}_ddtree_{b}", budget_label(m, b), [p.get(b) for p in per]))
    rows += [
        row("ground_truth", "ground truth", [s["ground_truth"] for s in sums]),
        row(
            "retokenisation_mismatch",
            "retokenisation mismatch",
            [s["retokenisation_mismatch"] for s in sums],
            "share",
        ),
        row("dtype", "dtype", [s["dtype"] for s in sums]),
    ]
    for m in registry.keyed():
        per = []
        for run in runs:
            got = [r for r in keyed_rows(run, m.name) if r["key"] is not None]
            value = shares(got) if m.reduce == registry.SUM else [r["value"] for r in got]
            per.append({key_text(r): (r, v) for r, v in zip(got, value, strict=True)})
        style = "share" if m.reduce == registry.SUM else m.style
        keys = {k: r for p in per for k, (r, _v) in p.items()}
        for k, r in sorted(keys.items(), key=lambda kv: (kv[1].get("group") or 0, kv[1]["key"])):
            vals = [p[k][1] if k in p else None for p in per]
            rows.append(row(f"{m.name}_{k}", key_label(m, r), vals, style))
    return rows
