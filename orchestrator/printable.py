"""Names as people are shown them: any string a host, a file system or a result file gave
(a checkpoint, run, host or file name) made safe to print, with nothing hidden.

A line break, a tab or another control character in a name would break a table row, a
log line or a CSV record, and a lone surrogate (``os.fsdecode`` of a file name that is not
UTF-8) cannot be encoded at all: `printable` writes each as a visible escape (``\\n``,
``\\t``, ``\\x1b``, ``\\udcff``), leaving every other character, non-ASCII letters
included, as it is. The tables, trees, progress lines and errors of the CLI, the CSV
export, the HTML report and the plots all show names through it.
"""

from __future__ import annotations

import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# control, surrogate, format (bidi overrides, zero-width), line and paragraph separators
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
