"""``relay-recv``: frames on stdin written into files under a folder, each hashed whole and
made durable before its line is printed (stdlib only).

The controller never parses human output: a JSON line per file (sha256 of the whole
resulting file, size) on stdout once that file is fsynced. The lock holder receives a
batch on its own channel the same way (`remote.relay.lock.serve`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import mmap
import os
import sys

from remote.errors import UserError
from remote.relay import sha256state, states
from remote.relay.direct import ALIGN, Writer, direct_flag
from remote.relay.fdfiles import message_name, open_dirs, open_leaf, open_root
from remote.relay.hasher import Hasher
from remote.relay.pipes import CHUNK, PATIENCE_HELP, emit, fill, patience_of, widen_pipe
from remote.relay.sha256state import GRID
from remote.relay.syncer import Syncer
from remote.relay.wire import (
    FRAME_HEADER,
    PARTIAL_PREFIX,
    PATIENCE,
    REPAIR_PREFIX,
    path_problem,
    read_exact,
    unbounded,
)


def _write_error(exc: OSError, rel: str) -> UserError:
    what = (exc.strerror or str(exc)).lower()
    return UserError(f"{what} while writing {message_name(rel)}")


def recv(args) -> int:
    """Write the frames on stdin into files under `root`; print each file's summary once it
    is durable.

    stdin starts with a frame holding the JSON request ``[{"path": P, "offset": N,
    "mtime": T, "state": S}, ...]``, then one frame per file in that order. P is relative to `root`
    and must lie in a partial folder (``.partial-<name>/...``) or be a repair temp file
    (``.../.dflash-repair-<file>``); no part of it may be a symlink (each folder is
    opened with O_NOFOLLOW, and so is the file), so nothing the request says can write
    outside `root`. With offset 0 a file is created or truncated; otherwise its first N
    bytes are kept and the frame appended after them, and the file's sha256 is still the
    whole file's, so a resumed file is checked end to end, not just its new tail: from
    the hash state saved at N in its sidecar (`states`, saved every GRID bytes once they
    are durable) where S is true and there is a valid one, else by hashing the kept bytes again
    (``prefix_read`` in its line says which). T, when given, becomes the file's mtime.
    A file's JSON line on stdout (index, sha256 and size of the whole file) comes only
    after its fsync, so the controller publishes nothing that a crash of the host could
    lose. A write error ends the command with one line naming the file and the OS error.
    Its first line, printed before the request is read, is ``{"ready": true}`` (see
    `remote.relay.send.send`: started ahead, used once ready); stdin closed before any
    request ends it quietly.
    """
    widen_pipe(0)
    waiter = getattr(args, "waiter", None) or patience_of(args)
    call = waiter.call if waiter is not None else unbounded
    emit(sys.stdout, {"ready": True})
    head = read_exact(0, FRAME_HEADER.size, call)
    if not head:
        return 0  # started ahead and not needed
    if len(head) < FRAME_HEADER.size:
        raise UserError("no request on stdin")
    requests = json.loads(read_exact(0, FRAME_HEADER.unpack(head)[0], call))
    for req in requests:
        _check_target(req.get("path"))
    root_fd = open_root(args.root)
    syncer = Syncer()
    spool = _Spool(call)
    try:
        for i, req in enumerate(requests):
            _recv_file(i, req, len(requests), root_fd, syncer, spool)
    finally:
        spool.close()
        syncer.close()
        os.close(root_fd)
    if syncer.error is not None:
        exc, rel = syncer.error
        raise _write_error(exc, rel)
    return 0


def _recv_file(i: int, req: dict, total: int, root_fd: int, syncer: Syncer, spool: _Spool):
    """Receive file `i` of a ``relay-recv`` request (see `recv`): this thread reads its
    frame from stdin into the spool's buffers and hashes them, the spool's thread writes
    them (and feeds a resumed file's hasher); the fsync and the file's line follow in the
    syncer's thread."""
    rel = req["path"]
    head = read_exact(0, FRAME_HEADER.size, spool.call)
    if len(head) < FRAME_HEADER.size:
        raise UserError(f"the stream ended after {i} of {total} files")
    left = FRAME_HEADER.unpack(head)[0]
    try:
        t = _open_for_write(root_fd, rel, int(req.get("offset") or 0), req.get("state") is True)
    except OSError as exc:
        raise _write_error(exc, rel) from None
    fd, direct, size = t.fd, t.direct, t.size
    out = Writer(fd, direct, size)
    # A resumed file without a saved state at its offset: its kept prefix is hashed in a
    # thread (read with O_DIRECT, as it was written) while the rest arrives; the new bytes
    # follow, from memory as far as KEEP allows, not before the first byte is read.
    h = t.h if t.h is not None else None if size else hashlib.sha256()
    hasher = Hasher(fd, size, direct=direct is not None, keep=KEEP) if h is None else None
    record_states = t.saved is not None  # blocks end on the GRID, whose states are saved
    written = [size]

    def store(block: memoryview, state: bytes | None = None) -> None:  # spool's thread
        syncer.wrote(fd, out.write(block), rel)
        written[0] += len(block)
        if hasher is not None:
            hasher.advance(written[0], block)
        if state is not None:
            end = written[0]
            syncer.durable(fd, lambda: t.save(root_fd, rel, end, state))

    try:
        while left:
            # until the file offset is aligned, read only up to the boundary
            boundary = (-size) % ALIGN if direct is not None else 0
            want = min(left, boundary or CHUNK)
            if record_states:
                want = min(want, GRID - size % GRID)
            block = spool.read(want)
            if not block:
                raise UserError(f"the stream ended inside {message_name(rel)}")
            if hasher is None:
                h.update(block)  # here: the stdin pipe fills meanwhile, for fewer reads
            if record_states and (size + len(block)) % GRID == 0:
                spool.put(functools.partial(store, state=h.state()), block)
            else:
                spool.put(store, block)
            size += len(block)
            left -= len(block)
        spool.drain()  # every block written (or the first error raised)
        if req.get("mtime") is not None:
            os.utime(fd, (float(req["mtime"]), float(req["mtime"])))
        record = {"i": i, "sha256": h.hexdigest() if hasher is None else None, "size": size}
        if t.size:  # a resumed file: its kept prefix, read again (fallback) or not
            record["prefix_read"] = t.size if hasher is not None else 0
        hashing, hasher = hasher, None
    except OSError as exc:
        _abandon(spool, syncer, out, hasher, fd)  # the partial file stays, to be resumed
        raise _write_error(exc, rel) from None
    except BaseException:
        _abandon(spool, syncer, out, hasher, fd)
        raise
    out.close()

    def finish(r=record, hs=hashing, n=size) -> None:  # in the syncer's thread
        r["sha256"] = hs.result(n)

    syncer.file_done(fd, lambda r=record: emit(sys.stdout, r), rel, finish if hashing else None)


class _Spool:
    """Blocks read from stdin, written to disk by a second thread.

    An O_DIRECT write waits for the disk (about 1 s per GiB on the test box), while the
    1 MiB pipe from sshd holds only milliseconds of the stream: written inline, every
    write stalled sshd and the ssh chain behind it. Here the reading thread reads and
    hashes (a fresh file's hash stays there, so the pipe fills meanwhile and each read
    takes more at once: draining it after every 32 KiB packet cost more CPU than it
    saved), and this thread writes. On the test box that took a 1 GiB receive from
    about 4 s to about 2.7 s of wall time at the same CPU. `SPOOL` page-aligned buffers
    (O_DIRECT needs aligned addresses) go round: `read` fills a free one, `put` queues
    it with the function that consumes it, the thread gives it back. A consumer's error
    is raised by the next `read` or `drain`; the blocks after it are skipped.
    """

    def __init__(self, call=unbounded):
        import queue
        import threading

        self.call = call  # how a read from stdin is made (`fill`)
        self.free: queue.Queue = queue.Queue()
        for _ in range(SPOOL):
            self.free.put(memoryview(mmap.mmap(-1, CHUNK)))
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.current: memoryview | None = None  # the buffer `read` filled last
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for job in iter(self.jobs.get, None):
            fn, block, buf = job
            try:
                if self.error is None:
                    fn(block)
            except BaseException as exc:  # raised in the reading thread
                self.error = exc
            finally:
                self.free.put(buf)
                self.jobs.task_done()

    def _raise(self) -> None:
        if self.error is not None:  # stays: the blocks queued after it are not written
            raise self.error

    def read(self, limit: int) -> memoryview:
        """Up to `limit` bytes (at most CHUNK) from stdin in a free buffer; fewer only at
        the end of the stream."""
        buf = self.free.get()
        try:
            self._raise()
            n = fill(0, buf[: min(limit, CHUNK)], self.call)
        except BaseException:
            self.free.put(buf)
            raise
        if not n:
            self.free.put(buf)
        self.current = buf
        return buf[:n]

    def put(self, fn, block: memoryview) -> None:
        """Queue `fn(block)` for the thread; `block` is what `read` returned last."""
        self.jobs.put((fn, block, self.current))

    def drain(self) -> None:
        """Wait until every queued block is consumed; raise the first error met."""
        self.jobs.join()
        self._raise()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


SPOOL = 4  # buffers of CHUNK bytes between the reading thread and the writing one


KEEP = 128 * 1024 * 1024  # new bytes of a resumed file queued in memory for its hash


def _abandon(spool: _Spool, syncer: Syncer, out: Writer, hasher: Hasher | None, fd: int) -> None:
    """Close a file whose receive failed (its queued writes, syncs and hashing thread end
    first)."""
    try:
        spool.drain()
    except BaseException:
        pass  # the error being handled is the one reported
    syncer.settle()
    out.close()
    if hasher is not None:
        hasher.stop()
    os.close(fd)


def _check_target(rel) -> None:
    """Refuse a requested write path outside a partial folder or repair temp file."""
    why = path_problem(rel)
    if why is None and not (
        rel.split("/")[0].startswith(PARTIAL_PREFIX)
        or rel.rsplit("/", 1)[-1].startswith(REPAIR_PREFIX)
    ):
        why = "is neither in a partial folder nor a repair file"
    if why is not None:
        raise UserError(f"refusing to write {rel!r}: the path {why}")


class _Target:
    """A file being received: its descriptors, the hash of its first `size` bytes when
    known without reading them (fresh, or resumed from a saved state), and its saved
    states (`states`), recorded in its sidecar as the bytes become durable."""

    def __init__(self, fd: int, direct: int | None, size: int):
        self.fd, self.direct, self.size = fd, direct, size
        self.h = None  # hash of the first `size` bytes, or None: the fallback hashes them
        self.saved: dict[int, bytes] | None = None  # None: no states kept for this file
        self.stat: os.stat_result | None = None

    def save(self, root_fd: int, rel: str, offset: int, state: bytes) -> None:
        """Record the state at `offset` in the sidecar (in the syncer's thread, after the
        fdatasync); a sidecar that cannot be written only costs a later prefix hash."""
        parts = rel.split("/")
        try:
            dfd = open_dirs(root_fd, parts[:-1], False, rel)
        except (OSError, UserError):
            return
        try:
            self.saved[offset] = state
            states.write_sidecar(dfd, parts[-1], self.stat, self.saved)
        except OSError:
            pass
        finally:
            os.close(dfd)


def _open_for_write(root_fd: int, rel: str, offset: int, use_state: bool = False) -> _Target:
    """`rel` under `root_fd` opened to append after `offset` (its first `offset` bytes
    kept), never through a symlink. A file in a partial folder keeps hash states in a
    sidecar (`states`): resumed at an offset it holds one for, and asked to use it
    (`use_state`: the controller chose the offset from this host's scan; ``--verify``
    does not), the hash goes on from there; its states past `offset` are dropped before
    the file is truncated."""
    parts = rel.split("/")
    dfd = open_dirs(root_fd, parts[:-1], True, rel)
    try:
        fd = open_leaf(dfd, parts[-1], os.O_RDWR | os.O_CREAT, rel)
        direct, flag = None, direct_flag()
        if flag:
            try:
                direct = open_leaf(dfd, parts[-1], os.O_WRONLY | flag, rel)
            except OSError:
                pass  # not supported here: buffered writes only
        t = _Target(fd, direct, offset)
        try:
            # A writer from a dropped connection may still be draining its pipe into this
            # file: wait for it, so the truncate below cannot be overtaken by its late bytes.
            fcntl.flock(fd, fcntl.LOCK_EX)
            t.stat = os.fstat(fd)
            got = t.stat.st_size
            if got < offset:
                raise UserError(
                    f"{message_name(rel)} holds {got} bytes, fewer than the offset {offset}"
                )
            if parts[0].startswith(PARTIAL_PREFIX) and sha256state.available():
                kept = states.read_sidecar(dfd, parts[-1], t.stat) if use_state else {}
                t.h = sha256state.new(kept[offset], offset) if offset in kept else None
                if t.h is not None or not offset:
                    t.h = t.h or sha256state.new()
                    t.saved = {k: v for k, v in kept.items() if k <= offset}
                try:
                    states.write_sidecar(dfd, parts[-1], t.stat, t.saved or {})
                except OSError:
                    t.saved = None  # cannot be written here: no states for this file
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            if direct is not None:
                os.close(direct)
            raise
    finally:
        os.close(dfd)
    return t


def register(sub) -> None:
    # The controller puts every positional argument after "--": a checkpoint or folder
    # name starting with "-" is then a name, not an option.
    p = sub.add_parser("relay-recv", help="write frames on stdin into files under ROOT")
    p.add_argument("root")
    p.add_argument("--patience", type=float, default=PATIENCE, help=PATIENCE_HELP)
    p.set_defaults(func=recv)
