"""A destination's relay-lock holder: the one command a relay runs on a destination.

``relay-lock`` (``remote.relay.lock.hold_lock``) takes the folder's lock, answers with its
scan, and then serves the relay's questions (hash, publish, scan) on its open channel
until its stdin closes. It also receives a batch of files when asked (``recv``), so the
transfer's first stream to that destination is this channel, not a new SSH session and
interpreter: an unchanged relay runs one command on each destination, and a changed one
has its first receiver ready as soon as the lock is.

`LockHolder` is that channel: a `Stream` (the pump writes the batch's frames straight
into it) with a question/answer dialogue (`ask`) and a borrowed-for-one-batch mode
(`borrow` ... `end_batch`). One of the two at a time: a question waits for a batch to end.
While neither, it is pinged (`keep_alive`): the holder ends after a while of silence
(its patience, `remote.relay.patience`), which frees the lock of a relay that vanished.
"""

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
    """The ``relay-lock`` channel of one destination folder, `root` (module docstring)."""

    def __init__(self, *args, root: str, **kwargs):
        super().__init__(*args, stdin=True, stdout=True, **kwargs)
        self.root = root
        self._lines = LineReader(lambda n: os.read(self.stdout_fd, n))
        self.busy = threading.Lock()  # a question or a batch: one at a time
        self.lost = False  # the channel ended (or broke): no lock any more
        self._batch = False  # borrowed for a batch (`borrow` ... `end_batch`)
        self._ended: tuple[int, bytes, str] | None = None
        self._pinging = False  # a ping has the channel (a batch may wait for it)
        self._pinger: threading.Thread | None = None
        self._stop = threading.Event()

    def _line(self) -> bytes:
        """The holder's next line; one over the reader's limit is an OSError naming it, as
        a broken channel is."""
        try:
            return self._lines.line()
        except LineTooLong as exc:
            raise OSError(f"the host sent {exc}") from None

    def finish(self) -> tuple[int, bytes, str]:
        """End the holder (EOF: it drops the lock and exits) and wait for it; once."""
        if self._ended is None:
            self.lost = True
            self._stop.set()
            if self._pinger is not None:
                self._pinger.join(timeout=10)  # a ping in flight: one round trip
            self._ended = super().finish()
        return self._ended

    def keep_alive(self, every: float) -> None:
        """Ping the holder every `every` seconds while nothing else has its channel, so
        its patience with this relay never runs out (the holder's deadline on silence);
        a ping that gets no ``pong`` loses the channel, as a failed question does."""
        self._pinger = threading.Thread(
            target=self._pings, args=(every,), daemon=True, name=f"ping-{self.host.name}"
        )
        self._pinger.start()

    def _pings(self, every: float) -> None:
        while not self._stop.wait(every) and not self.lost:
            if not self.busy.acquire(blocking=False):
                continue  # a question or a batch: the holder hears from us anyway
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
        """The holder's first answer (lock taken, with the scan, or refused), or None
        when it printed none (it failed to start)."""
        try:
            answer = json.loads(self._line())
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def ask(self, request: dict) -> dict:
        """One request, its answer; an ``error`` answer, a lost channel or a non-object
        answer raise `RelayError` naming the host."""
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
        """Take the channel for one batch of files (`end_batch` gives it back): whether
        it is now receiving. False when a batch or a question has it, or it is lost (a
        holder that does not say it is ready is ended: its lock is gone, and a batch
        meant for it fails rather than write there without the lock)."""
        if self.lost or not (
            self.busy.acquire(blocking=False)
            or (self._pinging and self.busy.acquire(timeout=60))  # a ping: one round trip
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
        """After a whole batch, nothing: the ``{"done"}`` line ends it, and EOF would drop
        the lock. After a cut one (the source's stream ended early) the holder waits
        inside or before a frame that never comes, and no later line could be told from
        payload: EOF ends its batch with an error and the holder with it, lock and all."""
        if not whole:
            self.close_stdin()

    def end_batch(self) -> tuple[int, bytes, str]:
        """After a borrowed batch's frames: (exit-code-like status, its per-file lines,
        error text) as `Stream.finish` gives them for a ``relay-recv`` of its own. The
        host's ``{"done": ...}`` line ends the batch; one with an error (the holder ends
        then) or the channel's end is a failure, and the channel is lost. A holder
        that was not borrowed (lost before the batch) reports that."""
        if not self._batch:
            return 1, b"", f"{ERROR_PREFIX}the relay's lock there ended; relay again"
        out: list[bytes] = []
        try:
            while True:
                try:
                    line = self._line()
                except OSError as exc:  # a broken channel, or a line past the limit
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
