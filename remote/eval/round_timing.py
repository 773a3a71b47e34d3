"""Timing round costs within a budget, reusing what the walk left (docs/results.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

REPEATS = 5  # timed trials of a part at most, after a warm-up
SHARE = 0.04  # the round costs' budget: this share of the walk's seconds (5% with the rest)
FLOOR_S = 1.0  # but never less: a small model's parts take milliseconds, all needed


def budget(walk_s: float) -> float:
    """Seconds the round costs may take after a walk of `walk_s` seconds."""
    return max(FLOOR_S, SHARE * walk_s)


def sync(device) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


class Trials:
    """Times parts of a round, each within its `share` of `budget_s`: a part stops before
    a trial that would pass it (its first kept alone, its spread then one number)."""

    def __init__(self, device, budget_s: float | None = None, parts: int = 3):
        self.device, self.budget = device, budget_s
        self.share = None if budget_s is None else budget_s / max(1, parts)
        self.spent = 0.0
        self.spread: dict[str, list[float]] = {}

    def best(self, name: str, run: Callable[[], Any], before: Callable[[], Any] | None = None):
        """The fastest of `run`'s timed trials (`before`, untimed, ahead of each)."""
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < REPEATS + 1:
            if before is not None:
                before()
            sync(self.device)
            t = time.perf_counter()
            run()
            sync(self.device)
            times.append(time.perf_counter() - t)
            if self._enough(time.perf_counter() - start, times[-1]):
                break
        self.spent += time.perf_counter() - start  # the untimed `before` counted too
        kept = times[1:] if len(times) > 2 else times  # the warm-up, where others were timed
        self.spread[name] = [min(kept), max(kept)] if len(kept) > 1 else kept
        return min(kept)

    def _enough(self, used: float, last: float) -> bool:
        """Whether one more trial like `last` would pass the part's share or the budget."""
        if self.share is None:
            return False
        return used + last > self.share or self.spent + used + last > self.budget

    def fits(self, seconds: float) -> bool:
        """Whether a trial of about `seconds` stays within the budget."""
        return self.budget is None or self.spent + seconds <= self.budget


def interpolate(points: dict[int, float], n: int) -> float:
    """Seconds of a forward over `n` tokens, linear between the nearest `points`."""
    xs = sorted(points)
    if n in points or len(xs) == 1:
        return points.get(n, points[xs[0]])
    lo = max([x for x in xs if x < n] or xs[:1])
    hi = min([x for x in xs if x > n] or xs[-1:])
    if lo == hi:
        lo, hi = (xs[0], xs[1]) if n < xs[0] else (xs[-2], xs[-1])
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[lo] + slope * (n - lo), min(points.values()))


class Capture:
    """The target, keeping its forward's cache, features and seconds over `ids`."""

    def __init__(self, target, ids: list[int]):
        self.target, self.ids = target, list(ids)
        self.cache = self.features = self.forward_s = None

    def __getattr__(self, name: str):
        return getattr(self.target, name)

    def forward(self, ids, layer_ids, argmax_from: int = 0, chunk: int = 256, final=False):
        if self.cache is not None or len(ids) != len(self.ids) or list(ids) != self.ids:
            return self.target.forward(ids, layer_ids, argmax_from, chunk, final=final)
        from transformers import DynamicCache

        cache = DynamicCache(config=self.target.model.config)
        t = time.perf_counter()
        got = self.target.forward(ids, layer_ids, argmax_from, chunk, cache=cache, final=final)
        self.forward_s = time.perf_counter() - t
        self.cache, self.features = cache, got[0]
        return got

    def context(self) -> dict | None:
        """What the costs reuse (``walked``), or None when the walk never ran the forward."""
        if self.cache is None:
            return None
        return {"cache": self.cache, "features": self.features, "forward_s": self.forward_s}
