"""Any name a host, file system or result file gave, made safe to print with nothing
hidden: every view shows names through it (docs/results.md, "Any name, any width")."""

from __future__ import annotations

import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A control character breaks a row, a lone surrogate (a non-UTF-8 file name) cannot encode.
_ESCAPED = {"Cc", "Cs", "Cf", "Zl", "Zp"}


def printable(text: str) -> str:
    """`text` with its control, format and lone surrogate characters escaped visibly."""
    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in _ESCAPED:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)
