"""Received files made durable in a background thread (`Syncer`), for ``relay-recv``."""

from __future__ import annotations

import os


class Syncer:
    """Makes received files durable in one background thread, overlapping the stream.

    While a file is written, `wrote` asks for an fdatasync every SYNC_EVERY bytes, so the
    final fsync has little left to flush and the stream never stalls on the disk at once.
    `file_done` queues the file's fsync and close; only after that fsync does the thread
    call the file's `on_durable` (which prints its summary), so a file the controller
    hears of is on disk before it publishes. The fsync of file i overlaps the receive of
    file i+1. Jobs run in order on one thread, so a datasync never meets a closed fd.
    """

    SYNC_EVERY = 64 * 1024 * 1024

    def __init__(self):
        import queue
        import threading

        self.jobs: queue.Queue = queue.Queue()
        self.pending = 0
        self.error: tuple[OSError, str] | None = None  # (error, file)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrote(self, fd: int, n: int, label: str = "") -> None:
        self.pending += n
        if self.pending >= self.SYNC_EVERY:
            self.pending = 0
            self.jobs.put((fd, (None, label, None)))

    def durable(self, fd: int, then) -> None:
        """Queue an fdatasync of `fd`, then `then()` once it succeeded (a hash state is
        recorded only for bytes that are on disk)."""
        self.pending = 0
        self.jobs.put((fd, (None, "", then)))

    def settle(self) -> None:
        """Wait until every job queued so far has run (before a failed file's fd closes:
        no queued datasync may meet that number reused)."""
        import threading

        done = threading.Event()
        self.jobs.put((-1, (None, "", done.set)))
        while not done.wait(0.1) and self.thread.is_alive():
            pass

    def file_done(self, fd: int, on_durable, label: str = "", before=None) -> None:
        """Queue the file's fsync and close, then `on_durable`; `before` (finishing a
        resumed file's hash, which still reads `fd`) runs first, here, so the receive
        of the next file does not wait for it."""
        self.pending = 0
        self.jobs.put((fd, (on_durable, label, before)))

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fd, (done, label, before) = job
            try:
                if done is None:
                    if fd < 0:
                        before()  # `settle`
                    elif self.error is None:
                        os.fdatasync(fd)
                        if before is not None:
                            before()
                    continue
                try:
                    if before is not None:
                        before()
                    os.fsync(fd)
                finally:
                    os.close(fd)
                done()
            except OSError as exc:  # reported by `close`: the file gets no summary
                self.error = self.error or (exc, label)

    def close(self) -> None:
        """Wait until every queued file is fsynced (and announced)."""
        self.jobs.put(None)
        self.thread.join()
