"""Bounded reads of what a host sends: lines of at most a size, and an end to waiting on
a silent or slow host."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.transport.hosts import HostError, Process

KiB, MiB = 1 << 10, 1 << 20


class LineTooLong(OSError):
    """A host sent more than the limit without ending its line."""


class LineReader:
    """Whole lines from a ``read(n)`` function, each at most `limit` bytes."""

    LIMIT = 64 * MiB

    def __init__(self, read: Callable[[int], bytes], limit: int = LIMIT, chunk: int = 64 * KiB):
        self.read = read
        self.limit = limit
        self.chunk = chunk
        self.buf = bytearray()

    def line(self, limit: int | None = None, *, longer: tuple[bytes, int] | None = None) -> bytes:
        """The next line; at the end what is left. `longer`: (prefix, a bigger limit for it)."""
        limit = self.limit if limit is None else limit
        seen = 0  # no newline up to here
        while (end := self.buf.find(b"\n", seen)) < 0:
            if len(self.buf) > limit:
                allowed = limit
                if longer is not None and self.buf.startswith(longer[0]):
                    allowed = longer[1]
                if len(self.buf) > allowed:
                    raise LineTooLong(f"a line over {_size(allowed)}")
            seen = len(self.buf)
            chunk = self.read(self.chunk)
            if not chunk:
                out, self.buf = bytes(self.buf), bytearray()
                return out
            self.buf += chunk
        with memoryview(self.buf) as view:  # one copy of a line that may be big
            out = bytes(view[: end + 1])
        del self.buf[: end + 1]
        return out

    def read_all(self, limit: int) -> bytes:
        """Everything to the end of the stream, at most `limit` bytes."""
        chunks, size = [bytes(self.buf)], len(self.buf)
        self.buf = bytearray()
        while chunk := self.read(self.chunk):
            size += len(chunk)
            if size > limit:
                raise LineTooLong(f"more than {_size(limit)}")
            chunks.append(chunk)
        return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n >> 10} KiB"


class Watchdog:
    """Calls `kill` once `silence` seconds pass without `touch`, or `deadline` in all."""

    def __init__(self, kill: Callable[[], None]):
        self.kill = kill
        self.expired: str | None = None
        self.silence: float | None = None
        self.deadline: float | None = None
        self._last = self._since = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def bound(self, *, silence: float | None = None, deadline: float | None = None) -> None:
        """From now on: at most `silence` s between bytes, `deadline` s in all (None: none)."""
        with self._lock:
            self.silence, self.deadline = silence, deadline
            self._last = self._since = time.monotonic()
            if (silence is not None or deadline is not None) and self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
                self._thread.start()

    def touch(self) -> None:
        self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                if self.silence is None and self.deadline is None:
                    self._thread = None
                    return
            now = time.monotonic()
            if self.deadline is not None and now - self._since > self.deadline:
                self.expired = "deadline"
            elif self.silence is not None and now - self._last > self.silence:
                self.expired = "silence"
            if self.expired:
                try:
                    self.kill()
                except (OSError, EOFError):  # its connection is gone already
                    pass
                return

    def stop(self) -> None:
        self._stop.set()


class HostLines:
    """The lines a command on `host` prints, bounded; a bound passed is one `HostError`."""

    def __init__(self, host: str, proc: Process, what: str, *, limit: int, hint: str = ""):
        self.host, self.proc, self.what, self.hint = host, proc, what, hint
        self.watchdog = Watchdog(proc.kill)
        self.reader = LineReader(self._read, limit, chunk=MiB)

    def _read(self, n: int) -> bytes:
        chunk = self.proc.read(n)
        self.watchdog.touch()
        return chunk

    def bound(self, *, silence: float | None = None, deadline: float | None = None) -> None:
        self.watchdog.bound(silence=silence, deadline=deadline)

    def line(self, limit: int | None = None, *, longer: tuple[bytes, int] | None = None) -> bytes:
        """The next line; over its limit, or a bound passed, is a `HostError`."""
        try:
            line = self.reader.line(limit, longer=longer)
        except LineTooLong as exc:
            self.kill()
            raise self.error(f"sent {exc}; refused") from None
        if not line.endswith(b"\n"):
            self.check_bounds()
        return line

    def read_all(self, limit: int) -> bytes:
        try:
            data = self.reader.read_all(limit)
        except LineTooLong as exc:
            self.kill()
            raise self.error(f"is {exc}; refused") from None
        self.check_bounds()
        return data

    def check_bounds(self) -> None:
        dog = self.watchdog
        if dog.expired == "silence":
            raise self.error(f"sent nothing for {dog.silence:g}s")
        if dog.expired == "deadline":
            raise self.error(f"did not finish within {dog.deadline:g}s")

    def wait(self) -> int:
        code = self.proc.wait()
        self.check_bounds()
        return code

    def error(self, what: str) -> HostError:
        return HostError(f"{self.host}: {self.what} {what}{'; ' + self.hint if self.hint else ''}")

    def kill(self) -> None:
        self.watchdog.stop()
        try:
            self.proc.kill()
        except (OSError, EOFError):
            pass

    def close(self) -> None:
        self.watchdog.stop()
