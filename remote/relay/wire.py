"""The relay's names on a host and frame format, validated; os and struct only."""

from __future__ import annotations

import os
import struct

MANIFEST = ".dflash-manifest.json"
PARTIAL_PREFIX = ".partial-"
REPAIR_PREFIX = ".dflash-repair-"
FRAME_HEADER = struct.Struct(">Q")
# A host command blocked this long on a silent controller ends, dropping its lock.
PATIENCE = 240.0


def path_problem(path) -> str | None:
    """Why `path` cannot name a file inside its folder (relative, normalised, one line), or None."""
    if not isinstance(path, str) or not path:
        return "is empty"
    if "\0" in path or "\n" in path or "\r" in path:
        return "holds a NUL or line break"
    if path.startswith("/"):
        return "is absolute"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "is not a plain relative path (an empty, '.' or '..' part)"
    return None


def name_problem(name) -> str | None:
    """Why `name` cannot be a checkpoint name (one path component), or None."""
    return path_problem(name) or ("holds a '/'" if "/" in name else None)


def unbounded(fn, *args):
    return fn(*args)


def read_exact(fd: int, n: int, call=unbounded) -> bytes:
    """Exactly `n` bytes from `fd`, fewer only at end of stream; `call` makes each read."""
    out = b""
    while len(out) < n:
        block = call(os.read, fd, n - len(out))
        if not block:
            break
        out += block
    return out
