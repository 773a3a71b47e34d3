"""vLLM's spec-decode counters from ``GET /metrics``, summed over engines, read as
differences around a run; an impossible one is `InvalidAnswer` (docs/online.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from remote.errors import UserError
from remote.httpclient import http_body
from remote.online.invalid import InvalidAnswer
from remote.online.prometheus import parse_prometheus

ROLE = "serving engine"  # as every error line names it
METRICS_BYTES = 16 << 20
METRIC = "vllm:spec_decode_"
COUNTER_NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POSITION = "num_accepted_tokens_per_pos"
SETTLE_SECONDS = 10.0  # vLLM updates /metrics a moment after it answers


@dataclass(frozen=True)
class Counters:
    """vLLM's spec-decode counters, summed over engines; `drafts`: verify steps."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def fields(self) -> list[tuple[str, int]]:
        """(the counter's full name, its value), the per-position ones by position."""
        named = zip(COUNTER_NAMES, (self.drafts, self.draft_tokens, self.accepted), strict=True)
        out = [(f"{METRIC}{n}_total", v) for n, v in named]
        pos = f"{METRIC}{PER_POSITION}_total"
        return out + [(f'{pos}{{position="{j}"}}', v) for j, v in enumerate(self.per_position)]

    def minus(self, before: Counters, where: str) -> Counters:
        """The counts made since `before`; a counter that went down is `InvalidAnswer`."""
        if len(before.per_position) not in (0, len(self.per_position)):
            raise InvalidAnswer(
                f"{METRIC}{PER_POSITION}_total",
                f"{where} changed its number of draft positions during the run",
            )
        base = before.per_position or (0,) * len(self.per_position)
        then = Counters(before.drafts, before.draft_tokens, before.accepted, base)
        for (name, now), (_n, old) in zip(self.fields(), then.fields(), strict=True):
            if now < old:
                raise InvalidAnswer(
                    name,
                    f"{where} {name} went backwards ({old} -> {now}) during the run: did "
                    "the server restart?",
                )
        return Counters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(self.per_position, base, strict=True)),
        )

    def covers(self, want: Counters) -> bool:
        """Every counter at least `want`'s (a shared server's other traffic adds more)."""
        got = dict(self.fields())
        return all(got.get(name, 0) >= v for name, v in want.fields())

    def to_json(self) -> dict[str, Any]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_position": list(self.per_position),
            "mean_acceptance_length": 1 + self.accepted / self.drafts if self.drafts else None,
        }


def spec_counters(text: str, where: str, model: str | None = None) -> Counters:
    """The spec-decode counters of a ``/metrics`` text (of `model`, when given), checked;
    zeros and no positions for a server without speculative decoding."""
    totals = dict.fromkeys(COUNTER_NAMES, 0.0)
    per_pos: dict[tuple[str, int], float] = {}
    for name, labels, value in parse_prometheus(text, where):
        if not name.startswith(METRIC) or not name.endswith("_total"):
            continue
        if model is not None and labels.get("model_name", model) != model:
            continue
        short = name[len(METRIC) : -len("_total")]
        if short not in totals and short != PER_POSITION:
            continue
        if not (value >= 0 and float(value).is_integer()):
            raise InvalidAnswer(name, f"{where} {name} is {value!r}, not a whole count >= 0")
        if short in totals:
            totals[short] += value
            continue
        pos = labels.get("position", "")
        if not pos.isdigit():
            raise UserError(f"{where} {name} has position {pos!r}, not a number")
        key = (labels.get("engine", ""), int(pos))
        if key in per_pos:
            raise UserError(f"{where} {name} lists position {pos} twice")
        per_pos[key] = value
    k = 1 + max((p for _e, p in per_pos), default=-1)
    by_pos = [0] * k
    for (_engine, p), v in per_pos.items():
        by_pos[p] += int(v)
    engines = {e for e, _p in per_pos}
    if len(per_pos) != k * len(engines):
        raise UserError(f"{where} {METRIC}{PER_POSITION}_total lacks some positions 0..{k - 1}")
    c = Counters(*(int(totals[n]) for n in COUNTER_NAMES), tuple(by_pos))
    if c.accepted > c.draft_tokens or (k and c.draft_tokens > k * c.drafts):
        raise InvalidAnswer(
            f"{METRIC}num_accepted_tokens_total",
            f"{where} counts {c.accepted} accepted of {c.draft_tokens} draft tokens in "
            f"{c.drafts} drafts of at most {k}: inconsistent",
        )
    grows = any(a < b for a, b in zip(by_pos, by_pos[1:], strict=False))
    if k and (sum(by_pos) != c.accepted or grows):
        raise InvalidAnswer(
            f"{METRIC}{PER_POSITION}_total",
            f"{where} per-position accepted counts {by_pos} do not add up to {c.accepted} "
            "or grow with the position",
        )
    return c


def metrics_url(url: str) -> str:
    url = url.rstrip("/")
    for tail in ("/v1/completions", "/v1"):
        if url.endswith(tail):
            url = url[: -len(tail)]
    return url + "/metrics"


def metrics_text(url: str, timeout: float = 30.0) -> str:
    """The server's ``/metrics`` page (bounded: `METRICS_BYTES`)."""
    where = metrics_url(url)
    return http_body(where, None, timeout, max_bytes=METRICS_BYTES, role=ROLE).decode(
        errors="replace"
    )


def read_counters(url: str, model: str | None = None, timeout: float = 30.0) -> Counters:
    return spec_counters(metrics_text(url, timeout), metrics_url(url), model)


def expected(specs: list[Any]) -> Counters | None:
    """What the counters must have grown by for these `SpecDecoding`s; None when one
    lacks per-step arrays."""
    if not specs or any(s is None or s.accepted is None for s in specs):
        return None
    k = max(s.num_spec_tokens for s in specs)
    per = [sum(sum(a > j for a in s.accepted) for s in specs) for j in range(k)]
    return Counters(
        sum(s.steps for s in specs),
        sum(s.num_draft_tokens for s in specs),
        sum(s.num_accepted for s in specs),
        tuple(per),
    )


def settled(
    url: str,
    before: Counters,
    want: Counters | None,
    requests: int,
    model: str | None = None,
    deadline_s: float = SETTLE_SECONDS,
) -> Counters:
    """The counters' growth since `before`, re-read until it covers `want` or
    `deadline_s` passed; still short is `InvalidAnswer`."""
    where = metrics_url(url)
    end = time.monotonic() + deadline_s
    while True:
        delta = read_counters(url, model).minus(before, where)
        if want is None or delta.covers(want) or time.monotonic() >= end:
            break
        time.sleep(0.2)
    if want is not None and not delta.covers(want):
        got = dict(delta.fields())
        name, need = next((n, v) for n, v in want.fields() if got.get(n, 0) < v)
        moved = got.get(name, 0)
        said = "did not move" if moved == 0 else f"grew by {moved} only"
        raise InvalidAnswer(
            name,
            f"{where} {name} {said} over {requests} requests whose answers count {need}: "
            "the server's counters do not count what it answers",
        )
    return delta
