"""Dataset metrics from per-sample records: ONE pure function, stdlib only.

The eval engine (`remote.eval.engine`) calls `summarize` on the records of the samples it
evaluated; the orchestrator's shard merge (`orchestrator.eval.shards.run`) calls the very same
function on the records gathered from several hosts. So a merged result's aggregates are
computed by exactly the code that computes a single host's, and are equal to them whenever
the per-sample records are. No torch here: the workstation imports this module too.

A record (one line of ``samples.jsonl``) carries ``rounds`` (acceptance lengths of the
walk), ``position_attempts`` / ``position_hits`` (per draft depth), ``agreement``
``{match, total}`` and ``ddtree`` ``{str(budget): rounds}``.
"""

from __future__ import annotations

import itertools


def ddtree_k(budget: int, topk: int | None, vocab: int) -> int:
    """Per-depth candidates actually used by DDTree-``budget``."""
    return max(1, min(budget, vocab, topk if topk else budget))


def round_starts(prompt_tokens: int, rounds: list[int]) -> list[int]:
    """The positions a walk of these round lengths started its rounds at: the first at the
    prompt's end, each next one where the last round's tokens end."""
    return list(itertools.accumulate(rounds[:-1], initial=prompt_tokens)) if rounds else []


def tau_stats(samples_rounds: list[list[int]]) -> dict:
    """tau both ways (mean of per-sample means, and tokens / rounds), rounds and tokens."""
    per = [sum(r) / len(r) for r in samples_rounds if r]
    total = sum(sum(r) for r in samples_rounds)
    n = sum(len(r) for r in samples_rounds)
    return {
        "tau_per_sample_mean": (sum(per) / len(per)) if per else None,
        "tau_token_weighted": (total / n) if n else None,
        "rounds": n,
        "tokens": total,
    }


def summarize(
    records: list[dict], block_size: int, budgets: list[int], topk: int | None, vocab: int
) -> dict:
    """Dataset metrics from sample records (see the result schema in remote/eval/engine.py).

    Depends only on the records' order-free sums except ``tau_per_sample_mean``, a mean of
    per-sample values; callers pass records in ground-truth order so floating-point sums
    are the same whoever computes them.
    """
    rounds = [r["rounds"] for r in records]
    hist = [0] * block_size
    for rr in rounds:
        for n in rr:
            hist[n - 1] += 1
    att = [sum(r["position_attempts"][j] for r in records) for j in range(block_size - 1)]
    hit = [sum(r["position_hits"][j] for r in records) for j in range(block_size - 1)]
    match = sum(r["agreement"]["match"] for r in records)
    total = sum(r["agreement"]["total"] for r in records)
    return {
        "samples": len(records),
        **tau_stats(rounds),
        "acceptance_histogram": {str(i + 1): hist[i] for i in range(block_size)},
        "per_position_acceptance": [
            {
                "position": j + 1,
                "attempts": att[j],
                "accepted": hit[j],
                "rate": (hit[j] / att[j]) if att[j] else None,
            }
            for j in range(block_size - 1)
        ],
        "target_agreement": {
            "match": match,
            "total": total,
            "rate": (match / total) if total else None,
        },
        "ddtree": {
            str(n): {
                "budget": n,
                "topk": ddtree_k(n, topk, vocab),
                **tau_stats([r["ddtree"][str(n)] for r in records]),
            }
            for n in budgets
        },
    }
