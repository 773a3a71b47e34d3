"""A destination's ``relay-lock`` holder: answers questions and receives batches on one
channel, one at a time, pinged while idle."""

from __future__ import annotations

import json
import os
import threading

from orchestrator.relay.report import RelayError
from orchestrator.relay.stream import Stream
from orchestrator.transport.lines import LineReader, LineTooLong
from remote.errors import ERROR_PREFIX
from remote.relay.fdfiles import write_all


class LockHolder(Stream):
    """The ``relay-lock`` channel of destination folder `root`."""

    def __init__(self, *args, root: str, **kwargs):
        super().__init__(*args, stdin=True, stdout=True, **kwargs)
        self.root = root
        self._lines = LineReader(lambda n: os.read(self.stdout_fd, n))
        self.busy = threading.Lock()
        self.lost = False  # the channel ended: no lock any more
        self._batch = False
        self._ended: tuple[int, bytes, str] | None = None
        self._pinging = False
        self._pinger: threading.Thread | None = None
        self._stop = threading.Event()

    def _line(self) -> bytes:
        """The holder's next line; one over the limit is an OSError."""
        try:
            return self._lines.line()
        except LineTooLong as exc:
            raise OSError(f"the host sent {exc}") from None

    def finish(self) -> tuple[int, bytes, str]:
        """End the holder (EOF drops the lock) and wait for it; once."""
        if self._ended is None:
            self.lost = True
            self._stop.set()
            if self._pinger is not None:
                self._pinger.join(timeout=10)
            self._ended = super().finish()
        return self._ended

    def keep_alive(self, every: float) -> None:
        """Ping the holder every `every` seconds while idle; no ``pong`` loses the channel."""
        self._pinger = threading.Thread(
            target=self._pings, args=(every,), daemon=True, name=f"ping-{self.host.name}"
        )
        self._pinger.start()

    def _pings(self, every: float) -> None:
        while not self._stop.wait(every) and not self.lost:
            if not self.busy.acquire(blocking=False):
                continue
            self._pinging = True
            try:
                write_all(self.stdin_fd, b'{"op": "ping"}\n')
                ok = self._line().strip() == b'{"pong": true}'
            except OSError:
                ok = False
            finally:
                self._pinging = False
                self.busy.release()
            if not ok and not self._stop.is_set():
                self.lost = True

    def first(self) -> dict | None:
        """The holder's first answer (locked with the scan, or refused), or None."""
        try:
            answer = json.loads(self._line())
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def ask(self, request: dict) -> dict:
        """One request, its answer; a failure raises `RelayError` naming the host."""
        with self.busy:
            try:
                write_all(self.stdin_fd, json.dumps(request).encode() + b"\n")
                raw = self._line()
            except OSError as exc:
                self.lost = True
                raise RelayError(
                    f"{self.host.name}: the relay's channel was lost ({exc})"
                ) from None
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.lost = True
            raise RelayError(f"{self.host.name}: the relay's channel was lost (no answer)")
        if "error" in answer:
            raise RelayError(f"{self.host.name}: {answer['error']}")
        return answer

    def borrow(self) -> bool:
        """Take the channel for one batch: whether it receives. A holder not ready is
        ended: no write without the lock."""
        if self.lost or not (
            self.busy.acquire(blocking=False) or (self._pinging and self.busy.acquire(timeout=60))
        ):
            return False
        try:
            write_all(self.stdin_fd, b'{"op": "recv"}\n')
            ready = self._line().strip() == b'{"ready": true}'
        except OSError:
            ready = False
        if ready:
            self._batch = True
        else:
            self.busy.release()
            self.lost = True
            self.failed = self.failed or "the relay's lock there ended; relay again"
            self.kill()
        return ready

    def end_frames(self, whole: bool = True) -> None:
        """After a cut batch, EOF: no later line could be told from payload."""
        if not whole:
            self.close_stdin()

    def end_batch(self) -> tuple[int, bytes, str]:
        """A borrowed batch's (status, per-file lines, error), as `Stream.finish` gives."""
        if not self._batch:
            return 1, b"", f"{ERROR_PREFIX}the relay's lock there ended; relay again"
        out: list[bytes] = []
        try:
            while True:
                try:
                    line = self._line()
                except OSError as exc:
                    self.lost = True
                    self.kill()
                    return 1, b"".join(out), f"{ERROR_PREFIX}{exc}"
                if not line:
                    self.lost = True
                    code, rest, err = self.finish()
                    return (code or 1), b"".join(out) + rest, err or "the channel ended"
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if isinstance(record, dict) and record.get("done") is True:
                    if "error" in record:
                        self.lost = True
                        return 1, b"".join(out), f"{ERROR_PREFIX}{record['error']}"
                    return 0, b"".join(out), ""
                out.append(line)
        finally:
            self._batch = False
            self.busy.release()
