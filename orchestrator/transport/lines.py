"""Bounded reads of what a host sends: whole lines of at most a size, and an end to waiting
on a host that stopped sending.

- `LineReader` takes lines from any ``read(n)`` (a channel, a pipe: a job's answers, the
  relay lock holder's). A line longer than its limit is refused with `LineTooLong` (an
  OSError, as a broken channel is) instead of being buffered until the workstation runs
  out of memory; one kind of line may be allowed more (`line(longer=...)`: a watch's end
  line carries the result files). Each read searches only the new bytes for the newline.
- `Watchdog` ends a command (calls its ``kill``) once `silence` seconds pass without a
  byte, or `deadline` seconds in all; the reader then sees the end of the stream, and
  `expired` says which bound it was.
- `HostLines` is both over one `Process`, every bound passed being one `HostError` line
  naming the host and what it was sending.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.transport.hosts import HostError, Process

KiB, MiB = 1 << 10, 1 << 20


class LineTooLong(OSError):
    """A host sent more than the limit without ending its line."""


class LineReader:
    """Whole lines from a ``read(n)`` function, `chunk` bytes asked at a time; what arrives
    after a line is kept for the next one."""

    LIMIT = 64 * MiB  # a scan of a very large checkpoint folder is a few MiB

    def __init__(self, read: Callable[[int], bytes], limit: int = LIMIT, chunk: int = 64 * KiB):
        self.read = read
        self.limit = limit
        self.chunk = chunk
        self.buf = bytearray()

    def line(self, limit: int | None = None, *, longer: tuple[bytes, int] | None = None) -> bytes:
        """The next line with its newline; at the end of the stream what is left (maybe
        b""). Over `limit` bytes (default: the reader's) without a newline is `LineTooLong`;
        `longer` = (prefix, bigger limit): a line that starts with that prefix may be up
        to the bigger one."""
        limit = self.limit if limit is None else limit
        seen = 0  # the buffer up to here holds no newline: search only what is new
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
        """Everything to the end of the stream; more than `limit` bytes is `LineTooLong`."""
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
    """Calls `kill` once `silence` seconds pass without `touch` (or `deadline` seconds in
    all, from the last `bound`); `expired` is then ``"silence"`` or ``"deadline"``. A
    daemon thread while a bound is set, ended by `stop`."""

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
        """From now on: at most `silence` seconds between bytes and `deadline` in all
        (None: no such bound; neither: the thread ends)."""
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
                    self._thread = None  # a later `bound` starts another
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
    """The lines a command on `host` prints (its `Process`), bounded (module docstring).
    `what` names the command in messages (``job watch``); `hint` ends every message (what
    the user can do next)."""

    def __init__(self, host: str, proc: Process, what: str, *, limit: int, hint: str = ""):
        self.host, self.proc, self.what, self.hint = host, proc, what, hint
        self.watchdog = Watchdog(proc.kill)
        self.reader = LineReader(self._read, limit, chunk=MiB)  # lines of up to many MiB

    def _read(self, n: int) -> bytes:
        chunk = self.proc.read(n)
        self.watchdog.touch()
        return chunk

    def bound(self, *, silence: float | None = None, deadline: float | None = None) -> None:
        """See `Watchdog.bound`."""
        self.watchdog.bound(silence=silence, deadline=deadline)

    def line(self, limit: int | None = None, *, longer: tuple[bytes, int] | None = None) -> bytes:
        """The next line (`LineReader.line`); a line over its limit, or a host that passed
        a bound, is a `HostError` (the command is killed)."""
        try:
            line = self.reader.line(limit, longer=longer)
        except LineTooLong as exc:
            self.kill()
            raise self.error(f"sent {exc}; refused") from None
        if not line.endswith(b"\n"):
            self.check_bounds()
        return line

    def read_all(self, limit: int) -> bytes:
        """All the rest of the output (`LineReader.read_all`), bounded as `line` is."""
        try:
            data = self.reader.read_all(limit)
        except LineTooLong as exc:
            self.kill()
            raise self.error(f"is {exc}; refused") from None
        self.check_bounds()
        return data

    def check_bounds(self) -> None:
        """The `HostError` of a bound passed (the stream then ended), if one was."""
        dog = self.watchdog
        if dog.expired == "silence":
            raise self.error(f"sent nothing for {dog.silence:g}s")
        if dog.expired == "deadline":
            raise self.error(f"did not finish within {dog.deadline:g}s")

    def wait(self) -> int:
        """The command's exit code (a bound still applies while it ends)."""
        code = self.proc.wait()
        self.check_bounds()
        return code

    def error(self, what: str) -> HostError:
        return HostError(f"{self.host}: {self.what} {what}{'; ' + self.hint if self.hint else ''}")

    def kill(self) -> None:
        """End the command now (the host's end of it sees its channel close)."""
        self.watchdog.stop()
        try:
            self.proc.kill()
        except (OSError, EOFError):  # its connection is gone already
            pass

    def close(self) -> None:
        """Stop watching (the command goes on, or has ended)."""
        self.watchdog.stop()
