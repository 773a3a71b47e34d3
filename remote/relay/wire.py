"""The relay's names on a host and its frame format on the wire, defined ONCE, with the
validators both sides apply to them.

Standard library only, and only `os` and `struct`: every relay command on a host imports
this at its start, the controller imports the same objects (a scan's paths are checked by
`path_problem` there, a frame read by `read_exact`), and `remote.protocol` re-exports the
names for everything else. Kept apart from `remote.protocol` because that one's
dataclasses and typing cost each short host-side command about 15 ms of its start.
"""

from __future__ import annotations

import os
import struct

MANIFEST = ".dflash-manifest.json"  # beside a published checkpoint's files, per file sha256
PARTIAL_PREFIX = ".partial-"  # <drafters>/.partial-<name>/: a checkpoint still arriving
REPAIR_PREFIX = ".dflash-repair-"
FRAME_HEADER = struct.Struct(">Q")  # the length of the payload that follows
# Seconds a host-side relay command waits on the controller with no sign of life (a
# request, a ping, a frame's bytes) before it ends, dropping its lock: a controller that
# vanished without closing its connection leaves no lock held. The controller gives up on
# a stalled stream after half of this, and pings an idle lock holder well within it.
PATIENCE = 240.0


def path_problem(path) -> str | None:
    """Why `path` cannot name a file inside its folder, or None when it can.

    A path a host answers (or a controller requests) must be relative, normalised (no
    empty, ``.`` or ``..`` parts), and free of NUL and line breaks: then joining it to its
    folder stays inside that folder. The controller checks every path a host's scan
    answers with this; the host-side commands check every path they are asked to write.
    """
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
    """Make a call that may block on the other end as it is (no deadline)."""
    return fn(*args)


def read_exact(fd: int, n: int, call=unbounded) -> bytes:
    """Exactly `n` bytes from `fd`, fewer only at end of stream: a frame's header or
    payload (8-byte big-endian length, then that many bytes; `FRAME_HEADER`). `call`
    makes each read (a host's `remote.relay.patience.Patience.call`: with a deadline)."""
    out = b""
    while len(out) < n:
        block = call(os.read, fd, n - len(out))
        if not block:
            break
        out += block
    return out
