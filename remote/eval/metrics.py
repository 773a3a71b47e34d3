"""Dataset metrics from records: pure functions, so merged results equal a host's."""

from __future__ import annotations

import statistics

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


# ``expected.method`` (docs/dflash-eval.md) and whether it is exact for the completions.
METHODS = {"dp": True, "walk": True, "seeded": False}
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "draft_policy")


def expected(records: list[dict], sampling: dict, method: str) -> dict:
    """The run's expectation from the records' ``expected``: tau per sample (mean of
    ``E[N/R]``, its standard error over samples), token-weighted tau (tokens over expected
    rounds; its delta-method error where seeded), per-position acceptance and the
    histogram, beside `sampling` (`SAMPLING_KEYS`, and ``seed`` where seeded)."""
    got = [r["expected"] for r in records if r["expected"]["tau"] is not None]
    taus = [e["tau"] for e in got]
    rounds = sum(e["rounds"] for e in got)
    depths = len(got[0]["position_attempts"]) if got else 0
    attempts = [sum(e["position_attempts"][j] for e in got) for j in range(depths)]
    hits = [sum(e["position_hits"][j] for e in got) for j in range(depths)]
    histogram: dict[str, float] = {}
    for e in got:
        for r, v in e["histogram"].items():
            histogram[r] = histogram.get(r, 0.0) + v
    tw = sum(e["tokens"] for e in got) / rounds if rounds else None
    tw_se = None
    if not METHODS[method] and len(got) > 1 and rounds:
        resid = [e["tokens"] - tw * e["rounds"] for e in got]
        tw_se = statistics.stdev(resid) / (rounds / len(got) * len(got) ** 0.5)
    seeded = {"seed": sampling.get("seed")} if method == "seeded" else {}
    return {
        "method": method,
        "exact": METHODS[method],
        **seeded,
        **{k: sampling.get(k) for k in SAMPLING_KEYS},
        "samples": len(got),
        "tau": statistics.fmean(taus) if taus else None,
        "tau_se": statistics.stdev(taus) / len(taus) ** 0.5 if len(taus) > 1 else None,
        "tau_token_weighted": tw,
        "tau_token_weighted_se": tw_se,
        "per_position": [h / a if a else None for h, a in zip(hits, attempts, strict=True)],
        "histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
    }
