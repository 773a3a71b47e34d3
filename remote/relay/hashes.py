"""``relay-hash``: sha256 of files or of their first bytes (``--verify``; stdlib only)."""

from __future__ import annotations

import hashlib
import json
import os
import sys

from remote.relay.pipes import CHUNK


def _hash_prefix(fd: int, length: int, h) -> int:
    done = 0
    while done < length:
        block = os.read(fd, min(CHUNK, length - done))
        if not block:
            break
        h.update(block)
        done += len(block)
    return done


def hash_files(args) -> int:
    """sha256 of files or of their first `length` bytes; requests as a JSON list on stdin."""
    print(json.dumps(hash_requests(json.load(sys.stdin))))
    return 0


def hash_requests(requests: list) -> list[dict]:
    """Per request ``{"path", "length"}``: its sha256 (``complete``: all there) or error."""
    out = []
    for req in requests:
        path, length = req["path"], req.get("length")
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            out.append({"path": path, "error": exc.strerror})
            continue
        h = hashlib.sha256()
        n = _hash_prefix(fd, length if length is not None else 1 << 62, h)
        os.close(fd)
        out.append(
            {
                "path": path,
                "length": n,
                "sha256": h.hexdigest(),
                "complete": length is None or n == length,
            }
        )
    return out


def register(sub) -> None:
    p = sub.add_parser("relay-hash", help="sha256 of files or prefixes (JSON on stdin)")
    p.set_defaults(func=hash_files)
