"""Direct I/O (O_DIRECT) for the relay's receiving host (docs/relay.md, "Data path")."""

from __future__ import annotations

import os

ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffer addresses aligned to blocks


def direct_flag() -> int:
    """O_DIRECT where this host has it, unless ``DFLASH_RELAY_BUFFERED=1``; else 0."""
    if os.environ.get("DFLASH_RELAY_BUFFERED") == "1":
        return 0
    return getattr(os, "O_DIRECT", 0)


def reopen_direct(fd: int) -> int | None:
    """A second, O_DIRECT read descriptor of open file `fd` (via /proc/self/fd), or None."""
    flag = direct_flag()
    if not flag:
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | flag)
    except OSError:
        return None


class Writer:
    """Writes a file from `pos` on: whole aligned blocks with O_DIRECT, the rest buffered."""

    def __init__(self, fd: int, direct: int | None, pos: int):
        self.fd, self.pos, self.direct = fd, pos, direct

    def write(self, block: memoryview) -> int:
        """Write `block` at the current offset; returns the bytes that went buffered."""
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
