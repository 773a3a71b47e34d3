"""Dataset metrics from records: one pure function, so merged results equal a host's."""

from __future__ import annotations

from remote.protocol.context import round_starts  # noqa: F401 (its callers know it here)
from remote.protocol.metrics import METRICS, WALK, Finding, Keyed, scalars


def ddtree_k(budget: int, topk: int | None, vocab: int) -> int:
    """Per-depth candidates actually used by DDTree-``budget``."""
    return max(1, min(budget, vocab, topk if topk else budget))


def summarize(
    records: list[dict], block_size: int, budgets: list[int], topk: int | None, vocab: int
) -> dict:
    """Registry entries and per-budget walk metrics; ground-truth order keeps sums equal."""
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
