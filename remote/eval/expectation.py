"""Speculative-sampling acceptance in expectation, along one sampled completion.

A round starting at ``s`` accepts depth ``j`` (predicting ``g[s+j]``), given every depth
before it was accepted, with probability ``a[s][j-1]`` (docs/dflash-eval.md: 1 or 0 for
argmax drafts, ``min(1, q(y)/p(y))`` for sampled drafts), independently across depths
given the completion. A round then produces ``r`` tokens with probability
``prod(a[:r-1]) * (1 - a[r-1])``, capped where the completion ends, as the walk caps it.
Everything below follows exactly (`Expectation.of`): the expected number of rounds, the
distribution of the number of rounds (so E[tokens / rounds], z-lab's per-sample tau, is
exact too), how often a round starts at each position, the expected acceptance
histogram and the expected per-position counts. `seeded_rounds` draws one walk.

A completion of N tokens costs O(N * B) for the expectations, and O(N * B) vector
operations of length N (torch) for the distribution of the round count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def round_lengths(acc: list[float], left: int, block: int) -> list[float]:
    """P(a round produces r tokens), r = 1..min(block, left): `acc` its depths'
    acceptance probabilities (depth 1 first), `left` the tokens the completion still
    has."""
    top = min(block, left)
    out, reach = [], 1.0
    for r in range(1, top):
        a = acc[r - 1] if r - 1 < len(acc) else 0.0
        out.append(reach * (1.0 - a))
        reach *= a
    out.append(reach)  # every depth before the cap accepted (or the block is full)
    return out


@dataclass
class Expectation:
    """What the walk of one completion gives in expectation (see the module docstring):
    `rounds` E[R], `tau` E[N / R] (N the tokens walked), `visits[i]` P(a round starts at
    the i-th position), `histogram[r]` the expected rounds producing r tokens, and the
    expected `attempts` and `hits` per depth (depth j attempted when 1..j-1 were accepted,
    within the block and the completion; `hits` weighted by `alpha`, each attempt's
    acceptance probability)."""

    tokens: int
    rounds: float
    tau: float | None
    visits: list[float]
    histogram: dict[int, float]
    attempts: list[float]
    hits: list[float]

    @classmethod
    def of(
        cls, acc: list[list[float]], block: int, alpha: list[list[float]] | None = None
    ) -> Expectation:
        """`acc[i]`: the acceptance probabilities of the round starting at the i-th
        walked position (the completion's first token is position 0; ``len(acc)`` = N
        tokens to walk), depth 1 first; `alpha` the probabilities the per-position counts
        weigh hits by (default `acc`)."""
        n = len(acc)
        alpha = acc if alpha is None else alpha
        lengths = [round_lengths(acc[i], n - i, block) for i in range(n)]
        rounds = [0.0] * (n + 1)  # expected rounds from position i to the end
        for i in range(n - 1, -1, -1):
            rounds[i] = 1.0 + sum(p * rounds[i + r] for r, p in enumerate(lengths[i], 1))
        visits = [0.0] * (n + 1)
        visits[0] = 1.0 if n else 0.0
        histogram: dict[int, float] = {}
        attempts, hits = [0.0] * (block - 1), [0.0] * (block - 1)
        for i in range(n):
            v = visits[i]
            if not v:
                continue
            for r, p in enumerate(lengths[i], 1):
                visits[i + r] += v * p
                histogram[r] = histogram.get(r, 0.0) + v * p
            reach = v
            for j in range(1, min(block - 1, n - i) + 1):
                attempts[j - 1] += reach
                hits[j - 1] += reach * alpha[i][j - 1]
                reach *= acc[i][j - 1]
                if not reach:
                    break
        tau = _mean_ratio(n, lengths) if n else None
        return cls(n, rounds[0], tau, visits[:n], histogram, attempts, hits)

    def to_json(self) -> dict:
        """The sample record's ``expected`` block (`remote.protocol.metrics`)."""
        return {
            "tokens": self.tokens,
            "rounds": self.rounds,
            "tau": self.tau,
            "histogram": {str(r): v for r, v in sorted(self.histogram.items())},
            "position_attempts": self.attempts,
            "position_hits": self.hits,
        }


def _mean_ratio(n: int, lengths: list[list[float]]) -> float:
    """E[n / R], R the number of rounds: the distribution of R from each position to the
    end, backwards (``dist[i][c]``: P(c rounds from position i)); a walk whose rounds are
    certain (argmax drafts) is walked instead."""
    if all(max(p) == 1.0 for p in lengths):
        i, count = 0, 0
        while i < n:
            i, count = i + lengths[i].index(1.0) + 1, count + 1
        return n / count
    import torch

    dist = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    dist[n, 0] = 1.0
    for i in range(n - 1, -1, -1):
        for r, p in enumerate(lengths[i], 1):
            if p:
                dist[i, 1 : n - i - r + 2] += p * dist[i + r, : n - i - r + 1]
    counts = torch.arange(n + 1, dtype=torch.float64)
    return float((dist[0, 1:] * n / counts[1:]).sum())


def seeded_rounds(acc: list[list[float]], block: int, seed: int) -> list[int]:
    """One walk of the completion drawn with `seed`: each depth accepted with its
    probability in `acc` until the first refusal, rounds capped at the end as the walk
    caps them (the round lengths a seeded engine run along this completion gives)."""
    rng = random.Random(seed)
    n, i, rounds = len(acc), 0, []
    while i < n:
        r, top = 1, min(block, n - i)
        while r < top and rng.random() < acc[i][r - 1]:
            r += 1
        rounds.append(r)
        i += r
    return rounds
