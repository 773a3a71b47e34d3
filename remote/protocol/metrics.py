"""The metric registry: every number an eval reports, defined ONCE (docs/results.md).

An entry names the number (its one name, in result.json, JSON views, CSV columns, tracker
tags and live events), says how one sample contributes (`parts`: a numerator and a
denominator read from the sample's record), how samples combine (`reduce`; the same for
one host's samples, merged shards and one category's) and how it prints. The engine's
summary, the result schema and every view of the controller read this list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# How samples combine: the mean of per-sample values, a ratio of summed parts, a sum.
MEAN, RATIO, SUM = "mean", "ratio", "sum"
# What `parts` reads: one walk's rounds (the chain's, and each DDTree budget's), or the
# whole sample record.
WALK, SAMPLE = "walk", "sample"
# The metric the headline, the paired delta and the CI gate lead with.
HEADLINE = "tau_per_sample_mean"
# Names the views used before they took the registry's (a follow history on disk).
OLD_NAMES = {"tau": "tau_per_sample_mean", "tau_tokens": "tau_token_weighted"}

Parts = tuple[float, float] | None


@dataclass(frozen=True)
class Metric:
    """One number over a set of samples. `parts(x)`: x is a walk's rounds (`of` WALK) or
    a record (SAMPLE); `stored`: kept in result.json as ``{num, den, rate}`` under these
    two names (else the bare value); `rank`: a table column, in rank order, 0 always
    shown, higher left out first at a narrow width (None: not a column); `budgets`:
    shown per DDTree budget too; `plot`: its line style on the tau-by-step plot; `live`:
    its running value travels in each sample's progress event; `interval`: views give a
    mean of per-sample values its bootstrap interval over the samples."""

    name: str
    label: str
    header: str
    definition: str
    parts: Callable[[Any], Parts]
    reduce: str = MEAN
    of: str = WALK
    style: str = "number"  # number (3 places), share (a percentage) or count
    stored: tuple[str, str] | None = None
    rank: int | None = None
    budgets: bool = False
    plot: str | None = None
    live: bool = False
    interval: bool = False

    def _input(self, rec: Mapping, budget: str | None) -> Any:
        if self.of == SAMPLE:
            return rec if budget is None else None
        rounds = rec.get("rounds") if budget is None else (rec.get("ddtree") or {}).get(budget)
        return rounds or []

    def sample_parts(self, rec: Mapping, budget: str | None = None) -> Parts:
        got = self._input(rec, budget)
        return None if got is None else self.parts(got)

    def per_sample(self, rec: Mapping, budget: str | None = None) -> float | None:
        """One sample's value (what a paired comparison pairs)."""
        p = self.sample_parts(rec, budget)
        if p is None:
            return None
        return p[0] if self.reduce == SUM else (p[0] / p[1] if p[1] else None)

    def sums(self, records: Iterable[Mapping], budget: str | None = None) -> tuple:
        got = [p for p in (self.sample_parts(r, budget) for r in records) if p is not None]
        return sum(n for n, _ in got), sum(d for _, d in got), got

    def value(self, records: Iterable[Mapping], budget: str | None = None) -> Any:
        """The metric over `records` (None where nothing contributes)."""
        num, den, got = self.sums(records, budget)
        if self.reduce == SUM:
            return num
        if self.reduce == RATIO:
            return num / den if den else None
        values = [n / d for n, d in got if d]
        return sum(values) / len(values) if values else None

    def stored_value(self, records: list[Mapping], budget: str | None = None) -> Any:
        """The metric as result.json keeps it."""
        if self.stored is None:
            return self.value(records, budget)
        num, den, _ = self.sums(records, budget)
        return {self.stored[0]: num, self.stored[1]: den, "rate": num / den if den else None}

    def text(self, value: Any) -> str:
        """`value` as this metric prints (`shown`)."""
        return shown(self.style, value)

    def read(self, metrics: Mapping) -> Any:
        """The value in a result's metrics (or a DDTree budget's entry)."""
        got = metrics.get(self.name)
        if self.stored is not None:
            return got.get("rate") if isinstance(got, dict) else None
        return got


@dataclass(frozen=True)
class Keyed:
    """A number per key (a draft position, an acceptance length): each sample gives
    `parts(record, block_size)`, ``{key: (num, den)}``, summed per key over samples;
    the keys every result lists are `keys(block_size)`. Stored as ``{key: num}``
    (`reduce` SUM) or as rows ``{key_name: key, den_name: den, num_name: num, "rate"}``
    (RATIO). Printed as a table of its rows (`key_name`, `den_name`, `num_name`, the
    value in `style`; a SUM's share of all)."""

    name: str
    label: str
    definition: str
    parts: Callable[[Mapping, int], dict[int, tuple[int, int]]]
    keys: Callable[[int], range]
    reduce: str
    key_name: str
    num_name: str
    den_name: str | None = None
    header: str = ""  # a row of a comparison: "<header> <key>"
    style: str = "share"  # how a RATIO's value prints (SUM: its share of all)

    def stored_value(self, records: list[Mapping], block_size: int) -> Any:
        num = dict.fromkeys(self.keys(block_size), 0)
        den = dict.fromkeys(num, 0)
        for rec in records:
            for k, (n, d) in self.parts(rec, block_size).items():
                num[k], den[k] = num[k] + n, den[k] + d
        if self.reduce == SUM:
            return {str(k): num[k] for k in num}
        return [
            {
                self.key_name: k,
                self.den_name: den[k],
                self.num_name: num[k],
                "rate": num[k] / den[k] if den[k] else None,
            }
            for k in num
        ]

    def rows(self, metrics: Mapping) -> list[dict]:
        """``[{key, num, den, value}]`` from a result's metrics, in key order; older
        shapes (a bare list of counts or rates) read too."""
        got = metrics.get(self.name) or []
        if isinstance(got, dict):
            pairs = sorted(((int(k), v) for k, v in got.items()), key=lambda kv: kv[0])
            got = [{self.key_name: k, self.num_name: v} for k, v in pairs]
        out = []
        for i, row in enumerate(got):
            if not isinstance(row, dict):  # the oldest results: bare values in key order
                row = {self.key_name: i + 1, ("rate" if self.den_name else self.num_name): row}
            num, den = row.get(self.num_name), row.get(self.den_name)
            value = num if self.reduce == SUM else row.get("rate")
            out.append({"key": row.get(self.key_name), "num": num, "den": den, "value": value})
        return out


@dataclass(frozen=True)
class Finding:
    """A judgement over a run's samples, one line or None (a cliff in tau by context: the
    first bucket below the first by more than its interval). `find(records, metrics)`
    runs where the metrics are summed (the engine, the shard merge), after the metrics
    before it; stored under `name` as text; printed as ``<label>: <line>``."""

    name: str
    label: str
    definition: str
    find: Callable[[list[Mapping], Mapping], str | None]


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
]


def shown(style: str, value: Any) -> str:
    """A value as a metric of `style` prints: ``-`` for none, a share as a percentage, a
    count whole, a number to 3 places."""
    if value is None:
        return "-"
    if style == "share" and isinstance(value, (int, float)):
        return f"{100 * value:.1f}%"
    if isinstance(value, float) and style != "count":
        return f"{value:.3f}"
    return str(value)


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
