"""Direct I/O (O_DIRECT) for the relay's receiving host: the one switch (`direct_flag`), a
second descriptor of an open file (`reopen_direct`), and a writer of aligned blocks
(`Writer`). Standard library ``os`` only.
"""

from __future__ import annotations

import os

ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffer addresses aligned to blocks


def direct_flag() -> int:
    """O_DIRECT where this host has it and ``DFLASH_RELAY_BUFFERED=1`` does not turn direct
    I/O off (see `Writer`), else 0: the one switch for the receiver's writes and reads."""
    if os.environ.get("DFLASH_RELAY_BUFFERED") == "1":
        return 0
    return getattr(os, "O_DIRECT", 0)


def reopen_direct(fd: int) -> int | None:
    """A second, O_DIRECT read descriptor of the file open as `fd` (Linux: through
    /proc/self/fd, which names that very file, not a path that could have changed), or
    None where that is not possible."""
    flag = direct_flag()
    if not flag:
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | flag)
    except OSError:
        return None


class Writer:
    """Writes a file from `pos` on, whole aligned blocks with O_DIRECT, the rest buffered.

    Measured on the 2-core test box (1 GiB, dd): buffered writes plus fdatasync took 3.1 s
    and 2.6 s of kernel CPU, O_DIRECT 0.6 s and 0.1 s. Copying into the page cache and
    writing it back was the receiving host's largest CPU cost, taken from the ssh and
    hashing processes sharing its cores. Direct writes reach the device at once; the
    fsync that follows each file still flushes the device's cache and the metadata, so
    durability is unchanged. A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6,
    some network and FUSE filesystems) gets buffered writes, and so does a host whose
    environment sets ``DFLASH_RELAY_BUFFERED=1`` (for a filesystem where direct I/O is
    accepted but slow).
    """

    def __init__(self, fd: int, direct: int | None, pos: int):
        self.fd, self.pos, self.direct = fd, pos, direct

    def write(self, block: memoryview) -> int:
        """Write `block` (starting at an aligned address) at the current offset; returns the
        bytes that went through the page cache (for the syncer)."""
        n = (
            len(block) - len(block) % ALIGN
            if self.direct is not None and self.pos % ALIGN == 0
            else 0
        )
        if n:
            try:
                _pwrite_all(self.direct, block[:n], self.pos)
            except OSError as exc:
                if exc.errno != 22:  # EINVAL: alignment this filesystem refuses
                    raise
                self.close()
                n = 0
        if n < len(block):
            _pwrite_all(self.fd, block[n:], self.pos + n)
        self.pos += len(block)
        return len(block) - n

    def close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        n = os.pwrite(fd, data, pos)
        data, pos = data[n:], pos + n
