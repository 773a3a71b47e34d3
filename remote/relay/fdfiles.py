"""Writes inside a folder held open as a descriptor, never through a symlink (stdlib only)."""

from __future__ import annotations

import errno
import os

from remote.errors import UserError
from remote.relay.wire import PARTIAL_PREFIX, REPAIR_PREFIX


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
    """Replace `name` in `dir_fd` by a temp file and a rename (`fsync`: durable first)."""
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


def open_root(root: str) -> int:
    """A descriptor of folder `root`; one `UserError` line when it cannot be opened."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UserError(f"cannot use {root}: {(exc.strerror or str(exc)).lower()}") from None


def open_dirs(root_fd: int, parts: list[str], create: bool, rel: str) -> int:
    """A descriptor of folder `parts` under `root_fd`, no symlink followed; made if `create`."""
    skip = len(rel.split("/")) - 1 - len(parts)  # leading parts of `rel` already opened
    fd = os.dup(root_fd)
    try:
        for n, part in enumerate(parts):
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(
                    f"/proc/self/fd/{fd}/{part}"
                ):
                    raise UserError(
                        f"refusing to write {message_name(rel)} through the symlink "
                        f"{'/'.join(rel.split('/')[: skip + n + 1])}"
                    ) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_leaf(dir_fd: int, name: str, flags: int, rel: str) -> int:
    """Open file `name` in `dir_fd` with O_NOFOLLOW; a symlink there is refused by name."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"refusing to write through the symlink {rel}") from None
        raise


def message_name(rel: str) -> str:
    """A received file as messages name it, without its partial or repair prefix."""
    parts = rel.split("/")
    if parts[0].startswith(PARTIAL_PREFIX):
        parts[0] = parts[0][len(PARTIAL_PREFIX) :]
    if parts[-1].startswith(REPAIR_PREFIX):
        parts[-1] = parts[-1][len(REPAIR_PREFIX) :]
    return "/".join(parts)
