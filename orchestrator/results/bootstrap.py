"""The seeded percentile bootstrap behind every interval of the results."""

from __future__ import annotations

RESAMPLES = 5000
CONFIDENCE = 0.95


def bootstrap_interval(
    diffs: list[float], resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `diffs`, seeded, resampled in numpy blocks."""
    import numpy as np

    n = len(diffs)
    if n == 1:
        return diffs[0], diffs[0]
    values = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    block = max(1, 2_000_000 // n)  # bounds a block's index array
    means = np.concatenate(
        [
            values[rng.integers(0, n, size=(min(block, resamples - start), n))].mean(axis=1)
            for start in range(0, resamples, block)
        ]
    )
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return float(lo), float(hi)


def cluster_interval(
    diffs: list[float],
    clusters: list[str],
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """The interval of the mean of `diffs` resampling whole clusters (a prompt's sampled
    completions together: they share the prompt, so they are not independent); every
    cluster of one value: `bootstrap_interval` itself."""
    import numpy as np

    names = list(dict.fromkeys(clusters))
    if len(names) == len(diffs):
        return bootstrap_interval(diffs, resamples, confidence, seed)
    if len(names) == 1:
        mean = sum(diffs) / len(diffs)
        return mean, mean
    where = {c: i for i, c in enumerate(names)}
    sums, counts = np.zeros(len(names)), np.zeros(len(names))
    for d, c in zip(diffs, clusters, strict=True):
        sums[where[c]] += d
        counts[where[c]] += 1
    rng = np.random.default_rng(seed)
    k = len(names)
    block = max(1, 2_000_000 // k)
    means = np.concatenate(
        [
            sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
            for start in range(0, resamples, block)
            for idx in [rng.integers(0, k, size=(min(block, resamples - start), k))]
        ]
    )
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return float(lo), float(hi)
