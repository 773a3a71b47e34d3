"""Byte counts and ages for people: ``10G`` and ``7d`` in, ``1.5 GiB`` and ``3.5 d`` out."""

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


_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.I)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str | float) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or seconds -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = _AGE.match(str(text))
    if not m:
        raise DflashError(f"not an age: {text!r} (use e.g. 7d, 12h, 30m, 90s or 0)")
    return float(m.group(1)) * _AGE_UNITS[m.group(2).lower() or "s"]


def human_age(seconds: float) -> str:
    """``5400`` -> ``1.5 h``: the largest of days, hours and minutes not above it."""
    for unit in ("d", "h", "m"):
        if seconds >= _AGE_UNITS[unit]:
            return f"{seconds / _AGE_UNITS[unit]:.1f} {unit}"
    return f"{seconds:.0f} s"


def human_bytes(n: float | int | None) -> str:
    """``1536`` -> ``1.5 KiB`` (powers of 1024); None -> ``-``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
