"""Writes inside a folder held open as a descriptor (``dir_fd``), for the relay's hosts.

A name is resolved against the open folder, never a path walked again, and the temp file
is created with O_EXCL | O_NOFOLLOW: a symlink planted at its name is removed, not
followed. Stdlib ``os`` only: a relay host command imports no more than it needs.
"""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data` to `fd` (os.write may take only part of it)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_new(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    tmp: str | None = None,
    mode: int = 0o644,
    fsync: bool = True,
) -> None:
    """Replace `name` in `dir_fd` by a temp file (`tmp`, default ``name.tmp``) and a
    rename; `fsync` makes it durable first. Errors are the caller's."""
    tmp = tmp or name + ".tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
