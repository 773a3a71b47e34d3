"""tau by category, sub-category and completion length, from a run's sample records."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.results import store as res
from orchestrator.results.summary import budget_key, columns
from remote.protocol import metrics as registry

AXES = ("category", "subcategory", "completion_length")
TITLES = {
    "category": "tau by category",
    "subcategory": "tau by sub-category",
    "completion_length": "tau by completion length (ground-truth tokens)",
}
NO_CATEGORY = "(none)"
# Inclusive upper bounds; the same for every run, so two runs' buckets pair.
LENGTH_EDGES = (64, 128, 256, 512, 1024)


def length_bucket(tokens: int) -> str:
    """The bucket of a completion of `tokens` tokens: ``1-64``, ``65-128``, ..., ``1025+``."""
    low = 1
    for edge in LENGTH_EDGES:
        if tokens <= edge:
            return f"{low}-{edge}"
        low = edge + 1
    return f"{low}+"


def _category(rec: dict) -> str | None:
    return rec.get("category")


def _subcategory(rec: dict) -> str | None:
    sub = rec.get("subcategory")
    return f"{rec.get('category') or NO_CATEGORY}/{sub}" if sub else None


def _length(rec: dict) -> str | None:
    n = rec.get("completion_tokens")
    return length_bucket(n) if isinstance(n, int) and n > 0 else None


KEYS: dict[str, Callable[[dict], str | None]] = {
    "category": _category,
    "subcategory": _subcategory,
    "completion_length": _length,
}


def groups(records: list[dict], axis: str) -> list[tuple[str, list[dict]]]:
    """(group name, its records) along `axis`, in the axis's order; [] when none has one."""
    key = KEYS[axis]
    if not any(key(r) is not None for r in records):
        return []
    out: dict[str, list[dict]] = {}
    for r in records:
        name = key(r)
        if name is None and axis == "subcategory":
            continue
        out.setdefault(NO_CATEGORY if name is None else name, []).append(r)
    if axis == "completion_length":
        order = {length_bucket(e): i for i, e in enumerate((*LENGTH_EDGES, LENGTH_EDGES[-1] + 1))}
        return sorted(out.items(), key=lambda kv: order.get(kv[0], len(order)))
    return list(out.items())


def group_stats(records: list[dict]) -> dict:
    """One group's registry metrics and headline per DDTree budget, summed as a run's."""
    head = registry.headline()
    budgets = sorted({b for r in records for b in (r.get("ddtree") or {})}, key=budget_key)
    return {
        **{m.name: m.value(records) for m in registry.scalars()},
        "ddtree": {b: head.value(records, b) for b in budgets},
    }


def breakdown(records: list[dict]) -> dict[str, list[dict]]:
    """Every axis that has groups: ``{axis: [{"name", **group_stats}]}``."""
    out = {}
    for axis in AXES:
        found = groups(records, axis)
        if found:
            out[axis] = [{"name": name, **group_stats(recs)} for name, recs in found]
    return out


def worth_showing(groups: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The axes with two groups or more (one group is the run's own line again)."""
    return {axis: rows for axis, rows in groups.items() if len(rows) > 1}


def of_run(run: res.Run) -> dict[str, list[dict]]:
    """The breakdown of `run`'s validated per-sample records ({} without samples.jsonl)."""
    return breakdown(res.records(run))


def flat(run: res.Run) -> dict[str, float | int | None]:
    """The breakdown as ``<metric>_<axis>_<group>`` columns for CSV and JSON lines."""
    out: dict[str, float | int | None] = {}
    found = of_run(run)
    cols = columns(g for rows in found.values() for g in rows)
    for axis, rows in found.items():
        for g in rows:
            out.update({f"{m.name}_{axis}_{g['name']}": g[m.name] for m in cols})
    return out


def tracked(run: res.Run) -> dict[str, float | int | None]:
    """The breakdown as ``<metric>/<axis>_<group>`` tracker scalars, counts left out."""
    out: dict[str, float | int | None] = {}
    found = of_run(run)
    cols = [m for m in columns(g for rows in found.values() for g in rows) if m.style != "count"]
    for axis, rows in found.items():
        for g in rows:
            out.update({f"{m.name}/{axis}_{g['name']}": g[m.name] for m in cols})
    return out
