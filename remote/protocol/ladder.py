"""A context ladder's rungs, read by both sides (docs/eval.md, "Long contexts")."""

from __future__ import annotations

import re

from remote.protocol.values import Check, SpecError, is_int

RUNG_MOST = 1 << 22  # beyond it a rung is a typo, not a context
RUNG_LEAST = 64
RUNGS_MOST = 16
# a rung's prompt is at least its length and at most this many tokens more
RUNG_OVER = 64

RUNGS = Check(
    f"a list of up to {RUNGS_MOST} context lengths in tokens, each {RUNG_LEAST} to "
    f"{RUNG_MOST}, rising",
    lambda v: (
        isinstance(v, list)
        and 0 < len(v) <= RUNGS_MOST
        and all(is_int(n) and RUNG_LEAST <= n <= RUNG_MOST for n in v)
        and all(a < b for a, b in zip(v, v[1:], strict=False))
    ),
)


def parse_rungs(text: str) -> list[int]:
    """``"1k,2k,4k"`` (``k``: 1024 tokens) as a checked list of rungs; a `SpecError` otherwise."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)([kK]?)", part)
        if not m:
            raise SpecError(
                f"context ladder rung {part!r} is not a length: write e.g. 1k,2k,4k "
                "(k = 1024 tokens) or plain token counts"
            )
        out.append(int(m.group(1)) * (1024 if m.group(2) else 1))
    return RUNGS.require("the context ladder", sorted(set(out)))


def longest(rungs: list[int] | tuple[int, ...], max_new_tokens: int) -> int:
    """The longest context a ladder's run reaches: its top rung's prompt and completion."""
    return max(rungs) + RUNG_OVER + max_new_tokens


def rung_name(tokens: int) -> str:
    """A rung as a label: ``4k`` for 4096 tokens, ``1500`` otherwise."""
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
