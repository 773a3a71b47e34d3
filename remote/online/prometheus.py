"""Prometheus text (version 0.0.4), a serving engine's ``/metrics``, parsed strictly."""

from __future__ import annotations

import re

from remote.errors import UserError

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus(text: str, where: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples as (name, labels, value), comments skipped; anything else is one line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise UserError(f"{where} line {n} is not a Prometheus sample: {line[:80]!r}")
        name, body, raw = m.group(1), m.group(2), m.group(3)
        labels: dict[str, str] = {}
        pos = 0
        while body and pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                raise UserError(f"{where} line {n} has a malformed label set: {line[:80]!r}")
            value = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], lm.group(2))
            labels[lm.group(1)] = value
            pos = lm.end()
        try:
            value = float(raw)
        except ValueError:
            raise UserError(f"{where} line {n} has value {raw!r}, not a number") from None
        out.append((name, labels, value))
    return out
