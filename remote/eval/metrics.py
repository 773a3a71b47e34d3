"""Dataset metrics from per-sample records, one pure stdlib function: the engine and the shard merge
both call `summarize`, so merged aggregates equal a single host's (definitions: the registry)."""

from __future__ import annotations

from remote.protocol.context import round_starts  # noqa: F401 (its callers know it here)
from remote.protocol.metrics import METRICS, WALK, Finding, Keyed, scalars


def ddtree_k(budget: int, topk: int | None, vocab: int) -> int:
    """Per-depth candidates actually used by DDTree-``budget``."""
    return max(1, min(budget, vocab, topk if topk else budget))


def summarize(
    records: list[dict], block_size: int, budgets: list[int], topk: int | None, vocab: int
) -> dict:
    """Dataset metrics from sample records: each registry entry, then the walk metrics per DDTree
    budget; records in ground-truth order, so float sums agree whoever computes them."""
    out: dict = {}
    for m in METRICS:
        if isinstance(m, Keyed):
            out[m.name] = m.stored_value(records, block_size)
        elif isinstance(m, Finding):
            out[m.name] = m.find(records, out)
        else:
            out[m.name] = m.stored_value(records)
    out["ddtree"] = {
        str(n): {
            "budget": n,
            "topk": ddtree_k(n, topk, vocab),
            **{m.name: m.value(records, str(n)) for m in scalars(WALK)},
        }
        for n in budgets
    }
    return out
