"""The metric registry: every number an eval reports, defined ONCE (docs/results.md).

An entry names the number (its one name, in result.json, JSON views, CSV columns, tracker
tags and live events), says how one sample contributes (`parts`: a numerator and a
denominator read from the sample's record), how samples combine (`reduce`; the same for
one host's samples, merged shards and one category's) and how it prints. The engine's
summary, the result schema and every view of the controller read this list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import remote.protocol.context as context
from remote.protocol.metric_kinds import (  # noqa: F401 (the registry's own names)
    MEAN,
    RATIO,
    SAMPLE,
    SUM,
    WALK,
    Finding,
    Keyed,
    Metric,
    Parts,
    shown,
)

# The metric the headline, the paired delta and the CI gate lead with; above temperature 0
# its expectation (`EXPECTED`) leads instead.
HEADLINE = "tau_per_sample_mean"
EXPECTED = "expected_tau"
# Names the views used before they took the registry's (a follow history on disk).
OLD_NAMES = {"tau": "tau_per_sample_mean", "tau_tokens": "tau_token_weighted"}


def _tokens(rounds: list[int]) -> Parts:
    return (sum(rounds), len(rounds)) if rounds else None


def _histogram(rec: Mapping, block: int) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for n in rec.get("rounds") or []:
        out[n] = (out.get(n, (0, 0))[0] + 1, 0)
    return out


def _positions(rec: Mapping, block: int) -> dict[int, tuple[int, int]]:
    att, hit = rec.get("position_attempts") or [], rec.get("position_hits") or []
    return {j + 1: (hit[j], att[j]) for j in range(min(len(att), len(hit), block - 1))}


def _expected(rec: Mapping, num: str, den: str | None) -> Parts:
    e = rec.get("expected")
    if not isinstance(e, dict) or e.get(num) is None or (den and not e.get(den)):
        return None
    return (e[num], e[den] if den else 1)


def _agreement(rec: Mapping) -> Parts:
    a = rec.get("agreement")
    return (a["match"], a["total"]) if isinstance(a, dict) and "total" in a else None


METRICS: list[Metric | Keyed | Finding] = [
    Metric(
        name="samples",
        label="samples",
        header="samples",
        definition="samples evaluated",
        parts=lambda rec: (1, 1),
        reduce=SUM,
        of=SAMPLE,
        style="count",
        rank=3,
    ),
    Metric(
        name="tau_per_sample_mean",
        label="tau (z-lab: mean of per-sample means)",
        header="tau",
        definition="each sample's mean acceptance length (accepted drafts + 1 per round), "
        "averaged over samples: z-lab's tau",
        parts=_tokens,
        rank=0,
        budgets=True,
        plot="-",
        live=True,
    ),
    Metric(
        name="tau_token_weighted",
        label="tau (token-weighted: tokens / rounds)",
        header="tau tok",
        definition="completion tokens over rounds, all samples together (what a decode's "
        "speed follows)",
        parts=_tokens,
        reduce=RATIO,
        rank=1,
        plot="--",
        live=True,
    ),
    Metric(
        name="rounds",
        label="rounds",
        header="rounds",
        definition="rounds walked",
        parts=lambda rounds: (len(rounds), 1),
        reduce=SUM,
        style="count",
    ),
    Metric(
        name="tokens",
        label="tokens",
        header="tokens",
        definition="completion tokens walked",
        parts=lambda rounds: (sum(rounds), 1),
        reduce=SUM,
        style="count",
    ),
    Keyed(
        name="acceptance_histogram",
        label="acceptance histogram",
        definition="rounds per acceptance length 1..B",
        parts=_histogram,
        keys=lambda block: range(1, block + 1),
        reduce=SUM,
        key_name="length",
        num_name="rounds",
        header="share of rounds accepting",
    ),
    Keyed(
        name="per_position_acceptance",
        label="per-position acceptance (position j correct given 1..j-1 correct)",
        definition="draft position j accepted, over the rounds that reached it",
        parts=_positions,
        keys=lambda block: range(1, block),
        reduce=RATIO,
        key_name="position",
        num_name="accepted",
        den_name="attempts",
        header="acceptance at position",
    ),
    Keyed(
        name="tau_by_context",
        label="tau by context (tokens / rounds of the rounds starting in each bucket)",
        definition="the chain walk's rounds placed by where they start (prompt + completion "
        "so far), in power-of-two buckets: bucket k holds positions k to 2k-1",
        parts=context.tau_parts,
        keys=lambda block: range(0),
        span=context.spanned(context.buckets),
        reduce=RATIO,
        key_name="context",
        num_name="tokens",
        den_name="rounds",
        header="tau at context",
        style="number",
        paired=True,
    ),
    Keyed(
        name="tau_by_position",
        label="acceptance against position (tau of the rounds starting at each point)",
        definition="the chain walk's tau against where its rounds start, eight points per "
        "doubling of the position",
        parts=context.curve_parts,
        keys=lambda block: range(0),
        span=context.occupied(context.point),
        reduce=RATIO,
        key_name="position",
        num_name="tokens",
        den_name="rounds",
        header="tau at position",
        style="number",
    ),
    Keyed(
        name="acceptance_histogram_by_context",
        label="acceptance histogram by context",
        definition="rounds per acceptance length 1..B, per context bucket",
        parts=context.histogram_parts,
        keys=lambda block: range(1, block + 1),
        span=context.spanned(context.buckets),
        group_name="context",
        reduce=SUM,
        key_name="length",
        num_name="rounds",
        header="share of rounds accepting",
    ),
    Keyed(
        name="per_position_acceptance_by_context",
        label="per-position acceptance by context (from the chain walk's rounds)",
        definition="draft position j accepted over the rounds that reached it, per context bucket",
        parts=context.position_parts,
        keys=lambda block: range(1, block),
        span=context.spanned(context.buckets),
        group_name="context",
        reduce=RATIO,
        key_name="position",
        num_name="accepted",
        den_name="attempts",
        header="acceptance at position",
    ),
    Finding(
        name="context_cliff",
        label="cliff in tau by context",
        definition="the first context bucket whose tau is below the first bucket's by more "
        "than the bootstrap interval of the difference allows",
        find=context.cliff,
    ),
    Metric(
        name="target_agreement",
        label="target agreement",
        header="agree",
        definition="ground-truth tokens equal to the eval host's argmax, teacher-forced",
        parts=_agreement,
        reduce=RATIO,
        of=SAMPLE,
        style="share",
        stored=("match", "total"),
        rank=2,
    ),
    Metric(
        name="expected_tau",
        label="expected tau (speculative sampling: mean of per-sample E[N/R])",
        header="E tau",
        definition="above temperature 0: each sample's exact expected acceptance length along "
        "its sampled completion (docs/dflash-eval.md), averaged over samples",
        parts=lambda rec: _expected(rec, "tau", None),
        of=SAMPLE,
        rank=4,
        sparse=True,
    ),
    Metric(
        name="expected_tau_token_weighted",
        label="expected tau (token-weighted: tokens / expected rounds)",
        header="E tau tok",
        definition="above temperature 0: completion tokens over expected rounds, all samples "
        "together",
        parts=lambda rec: _expected(rec, "tokens", "rounds"),
        reduce=RATIO,
        of=SAMPLE,
        rank=5,
        sparse=True,
    ),
]


def scalars(of: str | None = None) -> list[Metric]:
    """The registry's one-number metrics, in order (those of one kind: `of`)."""
    return [m for m in METRICS if isinstance(m, Metric) and of in (None, m.of)]


def keyed() -> list[Keyed]:
    return [m for m in METRICS if isinstance(m, Keyed)]


def findings() -> list[Finding]:
    return [m for m in METRICS if isinstance(m, Finding)]


def find(name: str) -> Metric | Keyed | Finding | None:
    return next((m for m in METRICS if m.name == name), None)


def headline() -> Metric:
    return next(m for m in scalars() if m.name == HEADLINE)


def walk_stats(walks: list[list[int]]) -> dict[str, Any]:
    """Every walk metric over these walks' rounds (one list per sample)."""
    recs = [{"rounds": r} for r in walks]
    return {m.name: m.value(recs) for m in scalars(WALK)}


def live() -> list[Metric]:
    """The metrics a progress event carries (`Metric.live`)."""
    return [m for m in scalars() if m.live]


def live_values(records: list[Mapping]) -> dict[str, Any]:
    """The running values of the `live` metrics over the samples done so far."""
    return {m.name: m.value(records) for m in live()}


def upgrade(entry: Mapping) -> dict:
    """`entry` with the names views used before (`OLD_NAMES`) read as the registry's."""
    out = {OLD_NAMES.get(k, k): v for k, v in entry.items()}
    out.update({k: entry[k] for k in entry if k in OLD_NAMES.values()})
    return out
