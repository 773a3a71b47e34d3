"""A real full disk for tests: a tiny tmpfs mounted at a folder (skipped, with the reason,
where mounting is not permitted), and a way to fill it to the last byte."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tiny_filesystem(folder: Path, size: str = "32m") -> Iterator[Path]:
    """`folder` as the mount point of a fresh tmpfs of `size` for the block; unmounted
    (and removed) after it. Skips the test when this process may not mount (not root, or
    no CAP_SYS_ADMIN in a container)."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        folder.rmdir()


def fill(folder: Path) -> Path:
    """Write a file in `folder` until its filesystem has no byte left (ENOSPC); returns it."""
    path = folder / "filler"
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return path
