"""Byte counts for people: ``10G`` in (`parse_size`), ``1.5 GiB`` out (`human_bytes`)."""

from __future__ import annotations

import re

from orchestrator.errors import DflashError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.I)


def parse_size(text: str | int) -> int:
    """``123``, ``10G``, ``1.5GiB``, ``500MB`` -> bytes (K/M/G/T/P are powers of 1024)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise DflashError(f"not a size: {text!r} (use e.g. 500M, 10G, 1.5TiB or bytes)")
    return int(float(m.group(1)) * 1024 ** " kmgtp".index(m.group(2).lower() or " "))


def human_bytes(n: float | int | None) -> str:
    """``1536`` -> ``1.5 KiB`` (powers of 1024); None -> ``-``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
