"""``relay-send``: files streamed as frames on stdout, each hashed whole (stdlib only)."""

from __future__ import annotations

import errno
import json
import os
import sys

from remote.errors import UserError
from remote.relay import sha256state, states
from remote.relay.fdfiles import write_all
from remote.relay.hasher import Hasher
from remote.relay.pipes import CHUNK, emit, widen_pipe
from remote.relay.scan import scan_root
from remote.relay.sha256state import GRID
from remote.relay.wire import FRAME_HEADER


def send(args) -> int:
    """Stream the requested files as frames, after a ready frame (``--scan``: its scan);
    each file's sha256 goes to stderr as a JSON line once hashed."""
    widen_pipe(1)
    hello = json.dumps(scan_root(args.scan)).encode() if args.scan else b""
    write_all(1, FRAME_HEADER.pack(len(hello)) + hello)
    raw = sys.stdin.buffer.read()
    if not raw.strip():
        return 0  # started ahead and not needed
    requests = json.loads(raw)
    hashing: list[tuple[int, str, Hasher, int, int]] = []
    copy = [not hasattr(os, "sendfile")]
    try:
        for i, req in enumerate(requests):
            hashing.append(_send_file(i, req, copy))
            while hashing and (len(hashing) > MAX_HASHING or hashing[0][2].done(hashing[0][4])):
                _finish_hash(*hashing.pop(0))
        while hashing:
            _finish_hash(*hashing.pop(0))
    finally:
        for _, _, hasher, fd, _ in hashing:  # a later file failed: they get no line
            hasher.stop()
            os.close(fd)
    return 0


MAX_HASHING = 8  # files whose hash may still run behind the stream
MAX_LAG = 256 * 1024 * 1024


def _finish_hash(i: int, path: str, hasher: Hasher, fd: int, size: int) -> None:
    try:
        digest = hasher.result(size)
    except OSError:
        raise UserError(f"{path} shrank while it was read") from None
    finally:
        os.close(fd)
    record = {"i": i, "sha256": digest, "size": size}
    if hasher.prefix_read is not None:
        record["prefix_read"] = hasher.prefix_read
    emit(sys.stderr, record)


def _send_file(i: int, req: dict, copy: list[bool]) -> tuple:
    """Stream file `i` as one frame; returns what `_finish_hash` needs."""
    path, offset = req["path"], int(req.get("offset") or 0)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    hasher = None
    cache = states.SourceStates.open(path, fd) if sha256state.available() else None
    try:
        size = os.fstat(fd).st_size
        if size < offset:
            raise UserError(f"{path} holds fewer than {offset} bytes")
        write_all(1, FRAME_HEADER.pack(size - offset))
        h = sha256state.new() if not offset else cache.lookup(offset) if cache else None
        if h is not None:
            hasher = _hash_and_send(fd, size, path, copy, offset, h, cache)
            hasher.prefix_read = 0 if offset else None
            return i, path, hasher, fd, size
        hasher = Hasher(fd, size)
        hasher.prefix_read = offset
        pos = offset
        while pos < size:
            # A hash far behind would reread pages the cache dropped: wait.
            hasher.wait(pos - MAX_LAG, offset)
            n = _send_block(fd, pos, min(CHUNK, size - pos), copy)
            if not n:
                raise UserError(f"{path} shrank while it was read")
            pos += n
    except BaseException:
        if hasher is not None:
            hasher.stop()
        os.close(fd)
        raise
    finally:
        if cache is not None:
            cache.close()
    return i, path, hasher, fd, size


class _Hashed:
    """A hash already done, answering like a `Hasher`."""

    prefix_read: int | None = None

    def __init__(self, digest: str):
        self.digest = digest

    def done(self, size: int) -> bool:
        return True

    def result(self, size: int) -> str:
        return self.digest

    def stop(self) -> None:
        pass


_BUFFER: list[memoryview] = []


def _hash_and_send(
    fd: int, size: int, path: str, copy: list[bool], pos: int, h, cache=None
) -> _Hashed:
    """Send `fd` from `pos` on, hashing each block (`h`: the first `pos` bytes') before
    ``sendfile`` sends it; on each `GRID` point `cache` records the state."""
    if not _BUFFER:
        _BUFFER.append(memoryview(bytearray(CHUNK)))
    buf = _BUFFER[0]
    while pos < size:
        n = os.preadv(fd, [buf[: min(CHUNK, size - pos, GRID - pos % GRID)]], pos)
        if not n:
            raise UserError(f"{path} shrank while it was read")
        h.update(buf[:n])
        end = pos + n
        if cache is not None and end % GRID == 0:
            cache.record(end, h.state())
        while pos < end:
            sent = _send_block(fd, pos, end - pos, copy)
            if not sent:
                raise UserError(f"{path} shrank while it was read")
            pos += sent
    return _Hashed(h.hexdigest())


def _send_block(fd: int, pos: int, count: int, copy: list[bool]) -> int:
    """Send up to `count` bytes of `fd` at `pos` to stdout (``sendfile``, else copy)."""
    if not copy[0]:
        try:
            return os.sendfile(1, fd, pos, count)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            copy[0] = True
    block = os.pread(fd, count, pos)
    write_all(1, block)
    return len(block)


def register(sub) -> None:
    p = sub.add_parser("relay-send", help="stream files (JSON list on stdin) as frames")
    p.add_argument("--scan", default=None, help="put this folder's scan in the ready frame")
    p.set_defaults(func=send)
