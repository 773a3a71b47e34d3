"""Dataset metrics from per-sample records: ONE pure function, stdlib only.

The eval engine (`remote.eval.engine`) calls `summarize` on the records of the samples it
evaluated; the orchestrator's shard merge (`orchestrator.eval.shards.run`) calls the very same
function on the records gathered from several hosts. So a merged result's aggregates are
computed by exactly the code that computes a single host's, and are equal to them whenever
the per-sample records are. No torch here: the workstation imports this module too.

What each metric is and how samples combine: the registry, `remote.protocol.metrics`.
"""

from __future__ import annotations

from remote.protocol.context import round_starts  # noqa: F401 (its callers know it here)
from remote.protocol.metrics import METRICS, WALK, Finding, Keyed, scalars


def ddtree_k(budget: int, topk: int | None, vocab: int) -> int:
    """Per-depth candidates actually used by DDTree-``budget``."""
    return max(1, min(budget, vocab, topk if topk else budget))


def summarize(
    records: list[dict], block_size: int, budgets: list[int], topk: int | None, vocab: int
) -> dict:
    """Dataset metrics from sample records: each entry of the metric registry, then the
    walk metrics per DDTree budget. Callers pass records in ground-truth order, so
    floating-point sums are the same whoever computes them."""
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
