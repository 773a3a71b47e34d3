"""``relay-send``: several files streamed as frames on stdout, each hashed whole (stdlib only).

The controller never parses human output: the frames go to stdout, and a JSON line per
file (sha256 of the WHOLE file, size) to stderr.
"""

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
    """Stream several files, one frame each, to stdout; hash every whole file.

    The request is a JSON list on stdin: ``[{"path": P, "offset": N}, ...]``. For each
    file, in order, one frame carries the bytes from N on: its length (the size when
    opened, minus N) and the bytes; the whole file, its first N bytes included, is
    hashed. One process and one ssh channel for a whole checkpoint: per file we measured
    ~0.25 s of process and channel start-up, which made an 8-file checkpoint half as fast
    as one file of the same size. A JSON line per file on stderr gives its index, sha256
    and size, in file order, once its hash is done; a file that cannot be read ends the
    stream (the files before it stand).

    The bytes go from the page cache to stdout by ``sendfile`` (no copy through this
    process into the pipe); the hash reads the same pages into one reused buffer: one copy
    per byte instead of the two of a read and a write (measured on the 2-core test box:
    1.08 CPU-s per GiB instead of 1.21-1.25, 0.83 of it the sha256 itself). A file sent
    whole is hashed block by block in this thread, just before the block goes out (hash
    threads cost more than they saved on a box whose cores are all busy). Every GRID
    bytes the hash state is saved in this host's cache (`states`); a file resumed at an
    offset whose state is there goes the same way from that state, its prefix unread.
    Without one, a resumed file is hashed whole by a `Hasher` thread while its rest
    streams, and the stream moves on to the next file while that hash finishes. A resumed
    file's line also says how many prefix bytes were hashed again (``prefix_read``).

    Before reading its request it writes a frame: *ready*, empty, or with ``--scan ROOT``
    the `scan_root` of ROOT as JSON. The controller starts a ``relay-send`` ahead, scanning
    the source, while it still plans, and uses it only once that frame came (a process
    that failed to start never sends it); one not needed gets an empty stdin and ends
    quietly.
    """
    widen_pipe(1)
    # ready; with --scan ROOT the frame holds ROOT's scan (the source's one question,
    # answered by the process that streams next: one command on the source per relay)
    hello = json.dumps(scan_root(args.scan)).encode() if args.scan else b""
    write_all(1, FRAME_HEADER.pack(len(hello)) + hello)
    raw = sys.stdin.buffer.read()
    if not raw.strip():
        return 0  # started ahead and not needed
    requests = json.loads(raw)
    # Files whose hash is still running (index, path, hasher, fd, size): the stream goes
    # on to the next file meanwhile, and their lines follow, in order, once done.
    hashing: list[tuple[int, str, Hasher, int, int]] = []
    copy = [not hasattr(os, "sendfile")]  # set once sendfile is refused here
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


MAX_HASHING = 8  # files whose hash may still run behind the stream (one descriptor each)
MAX_LAG = 256 * 1024 * 1024  # how far the stream may run ahead of its file's hash


def _finish_hash(i: int, path: str, hasher: Hasher, fd: int, size: int) -> None:
    try:
        digest = hasher.result(size)
    except OSError:
        raise UserError(f"{path} shrank while it was read") from None
    finally:
        os.close(fd)
    record = {"i": i, "sha256": digest, "size": size}
    if hasher.prefix_read is not None:  # a resumed file: its kept prefix, read again or not
        record["prefix_read"] = hasher.prefix_read
    emit(sys.stderr, record)


def _send_file(i: int, req: dict, copy: list[bool]) -> tuple:
    """Stream file `i` of a ``relay-send`` request as one frame (see `send`); returns what
    `_finish_hash` needs for its line (index, path, hasher, fd, size), once its hash is
    done."""
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
        # Read, hash and send in this thread (no hand-overs between threads): a file sent
        # whole, or resumed at an offset whose hash state this host saved when it sent it.
        h = sha256state.new() if not offset else cache.lookup(offset) if cache else None
        if h is not None:
            hasher = _hash_and_send(fd, size, path, copy, offset, h, cache)
            hasher.prefix_read = 0 if offset else None
            return i, path, hasher, fd, size
        hasher = Hasher(fd, size)  # the whole file, from the page cache, in a thread
        hasher.prefix_read = offset
        pos = offset
        while pos < size:
            # A hash far behind the stream (a resumed file's prefix read from a slow disk)
            # would read pages the stream read, and the cache dropped since, again: wait.
            hasher.wait(pos - MAX_LAG, offset)
            n = _send_block(fd, pos, min(CHUNK, size - pos), copy)
            if not n:  # shrank while read: the frame cannot be completed
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


_BUFFER: list[memoryview] = []  # the sender's one read buffer, made on first use


def _hash_and_send(
    fd: int, size: int, path: str, copy: list[bool], pos: int, h, cache=None
) -> _Hashed:
    """Send file `fd` from `pos` on and hash it, `h` being the hash of its first `pos`
    bytes: each block is read into one reused buffer and hashed, then the same bytes go
    out by ``sendfile`` from the page cache (one copy, not the two of a read and a
    write). Blocks end on the `GRID`, where `cache` (the source's saved states) records
    the state reached, for a later resume."""
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
    """Write up to `count` bytes of `fd` at `pos` to stdout; bytes written (0 at the end
    of the file). ``sendfile`` where the kernel takes it, else a read and a write."""
    if not copy[0]:
        try:
            return os.sendfile(1, fd, pos, count)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            copy[0] = True  # stdout or this file cannot take it: copy from now on
    block = os.pread(fd, count, pos)
    write_all(1, block)
    return len(block)


def register(sub) -> None:
    p = sub.add_parser("relay-send", help="stream files (JSON list on stdin) as frames")
    p.add_argument("--scan", default=None, help="put this folder's scan in the ready frame")
    p.set_defaults(func=send)
