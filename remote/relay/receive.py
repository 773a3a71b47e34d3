"""``relay-recv``: frames on stdin written into files under a folder, each hashed whole,
its JSON line printed once fsynced (stdlib only)."""

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
    """Write the frames on stdin (a request frame, then one per file) into files under
    `root`, only in partial folders or repair files (docs/relay.md, "Trust")."""
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
    """Receive file `i`: read and hash here, write in the spool's thread, fsync in the syncer's."""
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
    # Without a saved state, a resumed file's prefix is hashed in a thread.
    h = t.h if t.h is not None else None if size else hashlib.sha256()
    hasher = Hasher(fd, size, direct=direct is not None, keep=KEEP) if h is None else None
    record_states = t.saved is not None
    written = [size]

    def store(block: memoryview, state: bytes | None = None) -> None:
        syncer.wrote(fd, out.write(block), rel)
        written[0] += len(block)
        if hasher is not None:
            hasher.advance(written[0], block)
        if state is not None:
            end = written[0]
            syncer.durable(fd, lambda: t.save(root_fd, rel, end, state))

    try:
        while left:
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
        spool.drain()
        if req.get("mtime") is not None:
            os.utime(fd, (float(req["mtime"]), float(req["mtime"])))
        record = {"i": i, "sha256": h.hexdigest() if hasher is None else None, "size": size}
        if t.size:
            record["prefix_read"] = t.size if hasher is not None else 0
        hashing, hasher = hasher, None
    except OSError as exc:
        _abandon(spool, syncer, out, hasher, fd)  # the partial file stays, to be resumed
        raise _write_error(exc, rel) from None
    except BaseException:
        _abandon(spool, syncer, out, hasher, fd)
        raise
    out.close()

    def finish(r=record, hs=hashing, n=size) -> None:
        r["sha256"] = hs.result(n)

    syncer.file_done(fd, lambda r=record: emit(sys.stdout, r), rel, finish if hashing else None)


class _Spool:
    """Blocks read from stdin, written by a second thread so sshd's pipe keeps draining
    while an O_DIRECT write waits; a consumer's error is raised by the next `read`."""

    def __init__(self, call=unbounded):
        import queue
        import threading

        self.call = call
        self.free: queue.Queue = queue.Queue()
        for _ in range(SPOOL):
            self.free.put(memoryview(mmap.mmap(-1, CHUNK)))
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.current: memoryview | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for job in iter(self.jobs.get, None):
            fn, block, buf = job
            try:
                if self.error is None:
                    fn(block)
            except BaseException as exc:
                self.error = exc
            finally:
                self.free.put(buf)
                self.jobs.task_done()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def read(self, limit: int) -> memoryview:
        """Up to `limit` bytes from stdin in a free buffer; fewer only at the end."""
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
        self.jobs.put((fn, block, self.current))

    def drain(self) -> None:
        """Wait until every queued block is consumed; raise the first error."""
        self.jobs.join()
        self._raise()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


SPOOL = 4


KEEP = 128 * 1024 * 1024  # new bytes of a resumed file queued in memory for its hash


def _abandon(spool: _Spool, syncer: Syncer, out: Writer, hasher: Hasher | None, fd: int) -> None:
    try:
        spool.drain()
    except BaseException:
        pass
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
    """A file being received: descriptors, the hash of its first `size` bytes when known,
    its saved `states`."""

    def __init__(self, fd: int, direct: int | None, size: int):
        self.fd, self.direct, self.size = fd, direct, size
        self.h = None
        self.saved: dict[int, bytes] | None = None
        self.stat: os.stat_result | None = None

    def save(self, root_fd: int, rel: str, offset: int, state: bytes) -> None:
        """Record the state at `offset` in the sidecar; failing costs only a prefix hash."""
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
    """`rel` under `root_fd` opened to append after `offset`, never through a symlink; the
    hash continues from a sidecar state when `use_state`."""
    parts = rel.split("/")
    dfd = open_dirs(root_fd, parts[:-1], True, rel)
    try:
        fd = open_leaf(dfd, parts[-1], os.O_RDWR | os.O_CREAT, rel)
        direct, flag = None, direct_flag()
        if flag:
            try:
                direct = open_leaf(dfd, parts[-1], os.O_WRONLY | flag, rel)
            except OSError:
                pass
        t = _Target(fd, direct, offset)
        try:
            # A writer from a dropped connection may still drain into it: wait for it.
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
                    t.saved = None
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
    # Positional arguments come after "--": a name starting with "-" is a name.
    p = sub.add_parser("relay-recv", help="write frames on stdin into files under ROOT")
    p.add_argument("root")
    p.add_argument("--patience", type=float, default=PATIENCE, help=PATIENCE_HELP)
    p.set_defaults(func=recv)
