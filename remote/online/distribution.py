"""Above temperature 0: the engine's rounds against their exact distribution given its own
completions, from the offline acceptance probabilities (pure; docs/online.md, "Above
temperature 0")."""

from __future__ import annotations

import math
from typing import Any

from remote.eval.expectation import round_lengths

LEVEL = 0.01  # two-sided: the engine disagrees when its rounds are this unlikely or less
# Mass below this fraction of a distribution's peak is left out of sums: far below LEVEL,
# and it keeps a 128 x 512-token test from growing with every count that cannot happen.
TINY = 1e-18


def band(pmf: list[float]) -> range:
    """The counts holding all but a negligible mass (each left out below `TINY` x the
    largest): where sums over `pmf` need to run."""
    cut = TINY * max(pmf, default=0.0)
    kept = [c for c, v in enumerate(pmf) if v > cut]
    return range(kept[0], kept[-1] + 1) if kept else range(0)


def rounds_pmf(acc: list[list[float]], block: int) -> list[float]:
    """P(R = c), c = 0..n, R the rounds of the walk of one completion (`acc` as
    `remote.eval.expectation.Expectation.of` takes it)."""
    n = len(acc)
    dist: list[list[float]] = [[]] * (n + 1)
    bands: list[range] = [range(0)] * (n + 1)
    dist[n], bands[n] = [1.0], range(1)
    for i in range(n - 1, -1, -1):
        out = [0.0] * (n - i + 1)
        for r, p in enumerate(round_lengths(acc[i], n - i, block), 1):
            if p:
                tail = dist[i + r]
                for c in bands[i + r]:
                    out[c + 1] += p * tail[c]
        dist[i], bands[i] = out, band(out)
    return dist[0]


def convolve(pmfs: list[list[float]]) -> list[float]:
    """The distribution of a sum of independent counts."""
    total = [1.0]
    for pmf in pmfs:
        out = [0.0] * (len(total) + len(pmf) - 1)
        mine = band(pmf)
        for a in band(total):
            u = total[a]
            for b in mine:
                out[a + b] += u * pmf[b]
        total = out
    return total


def p_value(pmf: list[float], observed: int) -> float:
    """Two-sided: twice the smaller tail at `observed` (0 where it cannot happen)."""
    if not 0 <= observed < len(pmf) or pmf[observed] <= 0:
        return 0.0
    below, above = sum(pmf[: observed + 1]), sum(pmf[observed:])
    return min(1.0, 2 * min(below, above))


def interval(pmf: list[float], level: float = LEVEL) -> tuple[int, int]:
    """The central counts holding at least ``1 - level`` of the mass."""
    lo, acc = 0, 0.0
    while lo < len(pmf) - 1 and acc + pmf[lo] <= level / 2:
        acc += pmf[lo]
        lo += 1
    hi, acc = len(pmf) - 1, 0.0
    while hi > lo and acc + pmf[hi] <= level / 2:
        acc += pmf[hi]
        hi -= 1
    return lo, hi


def _mean(pmf: list[float], f) -> float:
    return sum(p * f(c) for c, p in enumerate(pmf) if p)


def test(samples: list[dict[str, Any]], level: float = LEVEL) -> dict[str, Any]:
    """`samples`: ``id``, ``tokens`` walked, ``observed`` rounds (the engine's, cut) and
    ``pmf`` (`rounds_pmf`) each. The engine's total rounds against their exact
    distribution (samples independent given their completions): its token-weighted tau
    inside the expectation's ``1 - level`` interval, or not; per sample the same, and the
    per-sample mean tau against its expectation with a normal interval."""
    rows, taus, means, var = [], [], 0.0, 0.0
    for s in samples:
        n, pmf = s["tokens"], s["pmf"]
        lo, hi = interval(pmf, level)
        e_tau = _mean(pmf, lambda c, n=n: n / c if c else 0.0)
        means += e_tau
        var += _mean(pmf, lambda c, n=n: (n / c) ** 2 if c else 0.0) - e_tau**2
        taus.append(n / s["observed"] if s["observed"] else 0.0)
        rows.append(
            {
                "id": s["id"],
                "tokens": n,
                "observed_rounds": s["observed"],
                "expected_rounds": _mean(pmf, float),
                "rounds_interval": [lo, hi],
                "expected_tau": e_tau,
                "observed_tau": taus[-1],
                "p_value": p_value(pmf, s["observed"]),
            }
        )
    total = convolve([s["pmf"] for s in samples])
    tokens = sum(s["tokens"] for s in samples)
    observed = sum(s["observed"] for s in samples)
    expected = _mean(total, float)
    lo, hi = interval(total, level)
    p = p_value(total, observed)
    k = len(samples)
    half = _z(level) * math.sqrt(max(var, 0.0)) / k if k else 0.0
    return {
        "level": level,
        "samples": k,
        "tokens": tokens,
        "observed_rounds": observed,
        "expected_rounds": expected,
        "rounds_interval": [lo, hi],
        "observed_tau": tokens / observed if observed else None,
        "expected_tau": tokens / expected if expected else None,
        "tau_interval": [tokens / hi if hi else None, tokens / lo if lo else None],
        "p_value": p,
        "agree": p > level,
        "per_sample_mean": {
            "observed": sum(taus) / k if k else None,
            "expected": means / k if k else None,
            "interval": [means / k - half, means / k + half] if k else None,
        },
        "samples_outside": sum(r["p_value"] <= level / max(k, 1) for r in rows),
        "per_sample": rows,
    }


def _z(level: float) -> float:
    """The two-sided normal quantile of `level` (bisection on erfc)."""
    lo, hi = 0.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2)) > level else (lo, mid)
    return (lo + hi) / 2


def judge(
    result: dict[str, Any], pmfs: dict[Any, list[float]], sampling: dict, level: float = LEVEL
) -> dict[str, Any]:
    """`result` (`verdict.compare` over the engine's own completions) judged in
    distribution: ``distribution`` (`test`), the offline taus the expectation's."""
    from remote.online import verdict

    result["sampling"] = sampling
    if result["online"] is None or result.get("invalid"):
        return verdict.conclude(result)
    samples = [
        {
            "id": r["id"],
            "tokens": len(pmfs[r["id"]]) - 1,
            "observed": len(r["online_rounds"]),
            "pmf": pmfs[r["id"]],
        }
        for r in result["per_sample"]
    ]
    got = test(samples, level)
    result["distribution"] = got
    result["offline"] = {
        **dict.fromkeys(result["offline"]),
        "samples": got["samples"],
        "tokens": got["tokens"],
        "tau_token_weighted": got["expected_tau"],
        "tau_per_sample_mean": got["per_sample_mean"]["expected"],
    }
    return verdict.conclude(result)
