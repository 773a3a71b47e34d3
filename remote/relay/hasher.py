"""A file's sha256 from offset 0 in a thread beside the stream (docs/relay.md, "Resume")."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os

from remote.relay.direct import ALIGN, reopen_direct
from remote.relay.pipes import CHUNK


class Hasher:
    """sha256 of ``[0, limit)`` of a file in a thread; `advance`, then `result`."""

    prefix_read: int | None = None  # the sender's: bytes of a kept prefix hashed again

    def __init__(self, fd: int, limit: int, direct: bool = False, keep: int = 0):
        import collections
        import threading

        self.fd, self.limit, self.pos, self.keep = fd, limit, 0, keep
        self.direct = reopen_direct(fd) if direct else None
        self.pieces: collections.deque = collections.deque()
        self.queued = 0
        self.h = hashlib.sha256()
        self.error: BaseException | None = None
        self.final: int | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def advance(self, limit: int, piece: memoryview | None = None) -> None:
        """Bytes up to `limit` are valid now; `piece`, the last of them, is queued if it fits."""
        with self.cond:
            if piece is not None and self.queued + len(piece) <= self.keep:
                start = limit - len(piece)
                if start >= self.pos:
                    self.pieces.append((start, bytes(piece)))
                    self.queued += len(piece)
            self.limit = limit
            self.cond.notify()

    def _next(self) -> tuple[int, bytes | None]:
        """(bytes to read, or the queued piece to hash) at the thread's position; (0, None): end."""
        with self.cond:
            while self.pos >= self.limit and self.final is None:
                self.cond.wait()
            end = self.limit if self.final is None else self.final
            if self.pos >= end:
                return 0, None
            while self.pieces and self.pieces[0][0] + len(self.pieces[0][1]) <= self.pos:
                self.queued -= len(self.pieces.popleft()[1])
            if self.pieces and self.pieces[0][0] <= self.pos:
                start, data = self.pieces.popleft()
                self.queued -= len(data)
                return 0, data[self.pos - start : end - start]
            stop = min(end, self.pieces[0][0]) if self.pieces else end
            return min(CHUNK, stop - self.pos), None

    def _run(self) -> None:
        """Read (or take queued) and hash; with O_DIRECT the hash runs in a second thread."""
        import queue
        import threading

        pipelined = self.direct is not None
        free: queue.Queue = queue.Queue()
        for _ in range(2 if pipelined else 1):
            free.put(memoryview(mmap.mmap(-1, CHUNK)))
        todo: queue.Queue = queue.Queue()

        def consume(item: tuple) -> None:
            data, buf = item
            self.h.update(data)
            if buf is not None:
                free.put(buf)

        def hash_blocks() -> None:
            for item in iter(todo.get, None):
                consume(item)

        hand = todo.put if pipelined else consume
        hashing = threading.Thread(target=hash_blocks, daemon=True)
        if pipelined:
            hashing.start()
        try:
            while True:
                want, data = self._next()
                if data is not None:
                    hand((data, None))
                    self.pos += len(data)
                    continue
                if not want:
                    return
                buf = free.get()
                n = self._read(buf, want)
                if not n:
                    raise OSError(errno.EIO, "the file shrank while it was hashed")
                hand((buf[:n], buf))
                self.pos += n
        except BaseException as exc:
            self.error = exc
        finally:
            if pipelined:
                todo.put(None)
                hashing.join()
            if self.direct is not None:
                os.close(self.direct)
                self.direct = None

    def _read(self, buf: memoryview, want: int) -> int:
        """Up to `want` bytes at the thread's position, aligned blocks by O_DIRECT."""
        aligned = want - want % ALIGN
        if self.direct is not None and aligned and self.pos % ALIGN == 0:
            try:
                return os.preadv(self.direct, [buf[:aligned]], self.pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.direct)
                self.direct = None
        return os.preadv(self.fd, [buf[:want]], self.pos)

    def done(self, size: int) -> bool:
        return self.pos >= size or not self.thread.is_alive()

    def wait(self, pos: int, start: int = 0) -> None:
        """Wait until the thread has hashed up to `pos` (or ended), once past `start`."""
        while self.pos < pos and pos > start and self.thread.is_alive():
            self.thread.join(0.005)

    def stop(self) -> None:
        """End the thread without a result: nothing reads `fd` after."""
        with self.cond:
            self.final = 0
            self.cond.notify()
        self.thread.join()

    def result(self, size: int) -> str:
        with self.cond:
            self.final = size
            self.cond.notify()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.h.hexdigest()
