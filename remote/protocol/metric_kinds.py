"""The metric registry's entry kinds and how each style prints. Stdlib only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# How samples combine: the mean of per-sample values, a ratio of summed parts, a sum.
MEAN, RATIO, SUM = "mean", "ratio", "sum"
# what `parts` reads: one walk's rounds, or the whole sample record
WALK, SAMPLE = "walk", "sample"

Parts = tuple[float, float] | None


@dataclass(frozen=True)
class Metric:
    """One number over a set of samples; its fields: docs/results.md (an entry's fields)."""

    name: str
    label: str
    header: str
    definition: str
    parts: Callable[[Any], Parts]
    reduce: str = MEAN
    of: str = WALK
    style: str = "number"
    stored: tuple[str, str] | None = None
    rank: int | None = None
    budgets: bool = False
    plot: str | None = None
    live: bool = False
    interval: bool = False
    sparse: bool = False  # a column only where some value is there (`summary.columns`)

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
    """A number per key, summed over samples, maybe grouped (docs/results.md)."""

    name: str
    label: str
    definition: str
    parts: Callable[[Mapping, int], dict[int, tuple[int, int]]]
    keys: Callable[[int], range]
    reduce: str
    key_name: str
    num_name: str
    den_name: str | None = None
    header: str = ""
    style: str = "share"  # how a RATIO's value prints (SUM: its share of all)
    span: Callable[[Sequence[Mapping]], list[int]] | None = None
    group_name: str | None = None
    paired: bool = False

    def all_keys(self, records: Sequence[Mapping], block_size: int) -> list:
        """The keys a result lists (each ``(group, key)`` of a grouped metric)."""
        if self.group_name is None:
            return list(self.span(records) if self.span else self.keys(block_size))
        return [(g, k) for g in self.span(records) for k in self.keys(block_size)]

    def stored_value(self, records: list[Mapping], block_size: int) -> Any:
        num = dict.fromkeys(self.all_keys(records, block_size), 0)
        den = dict.fromkeys(num, 0)
        for rec in records:
            for k, (n, d) in self.parts(rec, block_size).items():
                if k in num:
                    num[k], den[k] = num[k] + n, den[k] + d
        if self.reduce == SUM and self.group_name is None:
            return {str(k): num[k] for k in num}
        out = []
        for k in num:
            row = {self.group_name: k[0], self.key_name: k[1]} if self.group_name else {}
            row = row or {self.key_name: k}
            if self.reduce == SUM:
                out.append({**row, self.num_name: num[k]})
            else:
                rate = num[k] / den[k] if den[k] else None
                out.append({**row, self.den_name: den[k], self.num_name: num[k], "rate": rate})
        return out

    def rows(self, metrics: Mapping) -> list[dict]:
        """``[{key, num, den, value}]`` (and ``group``) in key order; older shapes read too."""
        got = metrics.get(self.name) or []
        if isinstance(got, dict):
            pairs = sorted(((int(k), v) for k, v in got.items()), key=lambda kv: kv[0])
            got = [{self.key_name: k, self.num_name: v} for k, v in pairs]
        out = []
        for i, row in enumerate(got):
            if not isinstance(row, dict):
                row = {self.key_name: i + 1, ("rate" if self.den_name else self.num_name): row}
            num, den = row.get(self.num_name), row.get(self.den_name)
            value = num if self.reduce == SUM else row.get("rate")
            group = row.get(self.group_name) if self.group_name else None
            out.append(
                {"key": row.get(self.key_name), "num": num, "den": den, "value": value}
                | ({"group": group} if self.group_name else {})
            )
        return out

    def per_key(self, rec: Mapping, block_size: int = 0) -> dict:
        """One sample's value per key (``num / den``): what a paired comparison pairs."""
        return {k: n / d for k, (n, d) in self.parts(rec, block_size).items() if d}


@dataclass(frozen=True)
class Finding:
    """A one-line judgement over a run's samples, or None (docs/results.md)."""

    name: str
    label: str
    definition: str
    find: Callable[[list[Mapping], Mapping], str | None]


def shown(style: str, value: Any) -> str:
    """A value in `style`: ``-``, a share as %, a count whole, else 3 places."""
    if value is None:
        return "-"
    if style == "share" and isinstance(value, (int, float)):
        return f"{100 * value:.1f}%"
    if isinstance(value, float) and style != "count":
        return f"{value:.3f}"
    return str(value)
