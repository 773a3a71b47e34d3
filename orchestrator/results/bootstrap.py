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
