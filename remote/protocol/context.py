"""Acceptance by context position: buckets, curve points, cliff (docs/context.md)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence

FIRST = 512
CURVE_STEPS = 8
RESAMPLES = 2000
CONFIDENCE = 0.95
MIN_SAMPLES = 2  # samples a bucket needs before the finder judges it

Parts = dict


def round_starts(prompt_tokens: int, rounds: list[int]) -> list[int]:
    """Where a walk of these round lengths started its rounds, the first at the prompt's end."""
    return list(itertools.accumulate(rounds[:-1], initial=prompt_tokens)) if rounds else []


def bucket(position: int) -> int:
    """The context bucket of a round starting at `position`."""
    return 0 if position < FIRST else 1 << (position.bit_length() - 1)


def buckets(low: int, high: int) -> list[int]:
    """Every bucket from `low`'s to `high`'s (positions), in order, the empty ones too."""
    out, k = [], bucket(low)
    while k <= bucket(high):
        out.append(k)
        k = FIRST if k == 0 else 2 * k
    return out


def point(position: int) -> int:
    """The acceptance curve's point (its first position) a round at `position` falls in."""
    width = max(1, max(bucket(position), FIRST) // CURVE_STEPS)
    return position - position % width


def rounds_of(rec: Mapping) -> list[tuple[int, int, bool]]:
    """(start, length, last) of each round of a sample record's chain walk."""
    rounds = rec.get("rounds") or []
    starts = round_starts(int(rec.get("prompt_tokens") or 0), rounds)
    last = len(rounds) - 1
    return [(s, n, i == last) for i, (s, n) in enumerate(zip(starts, rounds, strict=True))]


def spanned(of: Callable[[int, int], list[int]]) -> Callable[[Sequence[Mapping]], list[int]]:
    """The keys (`buckets` or `points`) from the earliest round start to the latest of `records`."""

    def keys(records: Sequence[Mapping]) -> list[int]:
        starts = [s for rec in records for s, _n, _last in rounds_of(rec)]
        return of(min(starts), max(starts)) if starts else []

    return keys


def occupied(key: Callable[[int], int]) -> Callable[[Sequence[Mapping]], list[int]]:
    """The keys (`point`s) some round of `records` starts in, in order."""

    def keys(records: Sequence[Mapping]) -> list[int]:
        return sorted({key(s) for rec in records for s, _n, _last in rounds_of(rec)})

    return keys


def _tokens_rounds(rec: Mapping, key: Callable[[int], int]) -> Parts:
    out: dict = {}
    for s, n, _last in rounds_of(rec):
        tokens, rounds = out.get(key(s), (0, 0))
        out[key(s)] = (tokens + n, rounds + 1)
    return out


def tau_parts(rec: Mapping, block: int) -> Parts:
    """``{bucket: (tokens, rounds)}`` of the sample's rounds starting in each bucket."""
    return _tokens_rounds(rec, bucket)


def curve_parts(rec: Mapping, block: int) -> Parts:
    """``{point: (tokens, rounds)}``: the same per curve point."""
    return _tokens_rounds(rec, point)


def histogram_parts(rec: Mapping, block: int) -> Parts:
    """``{(bucket, length): (rounds, 0)}``: the acceptance histogram per bucket."""
    out: dict = {}
    for s, n, _last in rounds_of(rec):
        got = out.get((bucket(s), n), (0, 0))
        out[(bucket(s), n)] = (got[0] + 1, 0)
    return out


def position_parts(rec: Mapping, block: int) -> Parts:
    """``{(bucket, j): (accepted, attempts)}``; a cut last round says no refusal."""
    out: dict = {}
    for s, n, last in rounds_of(rec):
        b = bucket(s)
        for j in range(1, min(n, block - 1) + 1):
            if j < n or not last:
                hit, att = out.get((b, j), (0, 0))
                out[(b, j)] = (hit + (j < n), att + 1)
    return out


def _ratio(parts: list[tuple[int, int]]) -> float:
    return sum(n for n, _ in parts) / sum(d for _, d in parts)


def _draws(parts: list[tuple[int, int]], rng: random.Random) -> list[float]:
    """The bucket's tau over `RESAMPLES` resamples of its samples."""
    return [_ratio(rng.choices(parts, k=len(parts))) for _ in range(RESAMPLES)]


def _interval(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    tail = (1 - CONFIDENCE) / 2
    pick = lambda q: ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]  # noqa: E731
    return pick(tail), pick(1 - tail)


def cliff(records: list[Mapping], metrics: Mapping) -> str | None:
    """The first bucket whose tau falls off beyond the interval, or a line saying none."""
    per: dict[int, list[tuple[int, int]]] = {}
    for rec in records:
        for k, got in tau_parts(rec, 0).items():
            per.setdefault(k, []).append(got)
    if not per:
        return None
    keys = sorted(per)
    first, rng = keys[0], random.Random(0)
    base = _draws(per[first], rng) if len(per[first]) >= MIN_SAMPLES else None
    skipped = [k for k in keys[1:] if len(per[k]) < MIN_SAMPLES]
    head = f"{first}: tau {_ratio(per[first]):.3f} over {len(per[first])} samples"
    if base is None or len(keys) == 1:
        why = "one context bucket" if len(keys) == 1 else f"too few samples at {first}"
        return f"not judged: {why} ({head})"
    for k in keys[1:]:
        if k in skipped:
            continue
        low, high = _interval([b - a for a, b in zip(base, _draws(per[k], rng), strict=True)])
        if high < 0:
            tau_k, tau_0 = _ratio(per[k]), _ratio(per[first])
            return (
                f"at context {k}: tau {tau_k:.3f} over {len(per[k])} samples against "
                f"{tau_0:.3f} at {first}; difference {tau_k - tau_0:+.3f} "
                f"[{low:+.3f}, {high:+.3f}] ({CONFIDENCE:.0%} bootstrap interval)"
            )
    note = f"; not judged (under {MIN_SAMPLES} samples): {skipped}" if skipped else ""
    return (
        f"none: no bucket up to {keys[-1]} is below the first by more than its interval "
        f"({head}){note}"
    )
