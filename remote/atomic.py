"""Atomic file writes, the one helper both sides use: a reader sees the old document or the
new one, never half; a failed write leaves no temporary file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike, data: str | bytes, *, fsync: bool = False) -> Path:
    """Write `data` to `path` through a temp file and a rename; `fsync` for crash safety."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if isinstance(data, bytes):
            fh = open(tmp, "wb")
        else:
            fh = open(tmp, "w", encoding="utf-8", newline="")
        with fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # name the file, not its temp
        exc.filename = str(path)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any, *, fsync: bool = False) -> Path:
    """`obj` as indented JSON with a final newline."""
    return write_atomic(path, json.dumps(obj, indent=2, default=str) + "\n", fsync=fsync)
