"""The least a hashing, durable relay must do on each host, with nothing else:
`relay_cpu.py`'s ``floor`` tool runs it as the remote command of ``ssh trainer | ssh evalhost``.

    python benchmarks/common/relay_floor.py send FILE   # FILE to stdout, its sha256 on stderr
    python benchmarks/common/relay_floor.py recv FILE   # stdin into FILE (O_DIRECT, fsync)

Each does what a dflash relay's host command cannot skip, the way ``relay-send`` and
``relay-recv`` do it: the sender hashes the file's pages read into one buffer and sends them
with ``sendfile``; the receiver reads stdin into one buffer, hashes it and writes it with
O_DIRECT, then fsyncs. Both widen their pipe to sshd to 1 MiB, as dflash's do. No framing,
no request, no lock, no hash states, no threads. dflash against this, in the same run, is
what dflash's code costs beyond the work; this against scp, how far below scp any relay
that hashes on both ends and writes durably can go on that machine.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the relay's own primitives, as its host commands use them
from remote.relay.direct import ALIGN  # noqa: E402
from remote.relay.fdfiles import write_all  # noqa: E402
from remote.relay.pipes import CHUNK, fill, widen_pipe  # noqa: E402


def send(path: str) -> str:
    widen_pipe(1)
    h = hashlib.sha256()
    buf = memoryview(mmap.mmap(-1, CHUNK))
    fd = os.open(path, os.O_RDONLY)
    off = 0
    while n := os.preadv(fd, [buf], off):
        h.update(buf[:n])
        sent = 0
        while sent < n:
            sent += os.sendfile(1, fd, off + sent, n - sent)
        off += n
    os.close(fd)
    return h.hexdigest()


def recv(path: str) -> str:
    widen_pipe(0)
    h = hashlib.sha256()
    buf = memoryview(mmap.mmap(-1, CHUNK))  # page-aligned, as O_DIRECT wants
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    while n := fill(0, buf):
        h.update(buf[:n])
        if n % ALIGN:  # the file's unaligned tail: written through the page cache
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        write_all(fd, buf[:n])
        if n < CHUNK:
            break
    os.fsync(fd)
    os.close(fd)
    return h.hexdigest()


if __name__ == "__main__":
    what, path = sys.argv[1:3]
    print((send if what == "send" else recv)(path), file=sys.stderr)
