"""The serving engine's decode time from vLLM's ``/metrics`` (docs/online.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from remote.online.invalid import InvalidAnswer
from remote.online.prometheus import parse_prometheus

DECODE_TIME = "vllm:request_decode_time_seconds"


@dataclass(frozen=True)
class DecodeTime:
    """vLLM's decode-time histogram summed over engines: seconds, and requests."""

    seconds: float
    requests: int

    def minus(self, before: DecodeTime, where: str) -> DecodeTime:
        """The time and requests since `before`; going backwards is `InvalidAnswer`."""
        if self.seconds < before.seconds or self.requests < before.requests:
            raise InvalidAnswer(
                DECODE_TIME, f"{where} {DECODE_TIME} went backwards: did the server restart?"
            )
        return DecodeTime(self.seconds - before.seconds, self.requests - before.requests)


def decode_time(text: str, where: str, model: str | None = None) -> DecodeTime | None:
    """The histogram's ``_sum`` and ``_count`` (of `model`), checked; None without."""
    total, count, seen = 0.0, 0.0, False
    for name, labels, value in parse_prometheus(text, where):
        if name not in (DECODE_TIME + "_sum", DECODE_TIME + "_count"):
            continue
        if model is not None and labels.get("model_name", model) != model:
            continue
        if not (math.isfinite(value) and value >= 0):
            raise InvalidAnswer(name, f"{where} {name} is {value!r}, not seconds or a count >= 0")
        seen = True
        if name.endswith("_sum"):
            total += value
        elif float(value).is_integer():
            count += value
        else:
            raise InvalidAnswer(name, f"{where} {name} is {value!r}, not a whole count")
    return DecodeTime(total, int(count)) if seen else None


def settled(
    read: Callable[[], DecodeTime | None],
    before: DecodeTime | None,
    requests: int,
    where: str,
    deadline_s: float = 10.0,
) -> DecodeTime | None:
    """Decode time since `before`, re-read until `requests` count or `deadline_s`."""
    if before is None:
        return None
    end = time.monotonic() + deadline_s
    while True:
        now = read()
        delta = now.minus(before, where) if now is not None else None
        if delta is None or delta.requests >= requests or time.monotonic() >= end:
            return delta
        time.sleep(0.2)
