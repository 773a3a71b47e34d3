"""Checkpoint folders of random files, and what a relay left in a destination folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

from remote.protocol import MANIFEST


def make_checkpoint(
    root: Path, name: str, sizes: dict[str, int], marker: bool = True, seed: int = 0
) -> dict[str, bytes]:
    """A checkpoint folder of random files (with the COMPLETE marker unless told not to)."""
    files = {}
    for rel, size in sizes.items():
        path = root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size) if size else b""
        path.write_bytes(data)
        files[rel] = data
    if marker:
        (root / name / "COMPLETE").write_bytes(b"")
        files["COMPLETE"] = b""
    return files


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes), the manifest excluded."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def published(dst: Path) -> list[str]:
    """The checkpoint names published in a drafters folder (hidden entries left out)."""
    return sorted(p.name for p in dst.iterdir() if not p.name.startswith("."))


def settled_size(path: Path) -> int:
    """The size of a file once the host-side writer of a dropped connection has drained
    what was already in its pipe (unchanged across 0.5 s)."""
    last = -1
    while (size := path.stat().st_size) != last:
        last = size
        time.sleep(0.5)
    return size


def without_tokenizer(target: Path, dest: Path) -> Path:
    """A copy of a real target folder with its config and weights but none of its tokenizer
    files (what an exported checkpoint often is); `dest` is made once and reused."""
    if not dest.is_dir():
        dest.mkdir(parents=True)
        for p in Path(target).iterdir():
            if p.name in ("config.json", "generation_config.json") or ".safetensors" in p.name:
                (dest / p.name).write_bytes(p.read_bytes())
    return dest
