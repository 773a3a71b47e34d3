"""Received files made durable in a background thread (`Syncer`), for ``relay-recv``."""

from __future__ import annotations

import os


class Syncer:
    """Makes received files durable in one background thread, overlapping the stream; a
    file's `on_durable` runs only after its fsync."""

    SYNC_EVERY = 64 * 1024 * 1024

    def __init__(self):
        import queue
        import threading

        self.jobs: queue.Queue = queue.Queue()
        self.pending = 0
        self.error: tuple[OSError, str] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrote(self, fd: int, n: int, label: str = "") -> None:
        self.pending += n
        if self.pending >= self.SYNC_EVERY:
            self.pending = 0
            self.jobs.put((fd, (None, label, None)))

    def durable(self, fd: int, then) -> None:
        """Queue an fdatasync of `fd`, then `then()`."""
        self.pending = 0
        self.jobs.put((fd, (None, "", then)))

    def settle(self) -> None:
        """Wait until every job queued so far has run."""
        import threading

        done = threading.Event()
        self.jobs.put((-1, (None, "", done.set)))
        while not done.wait(0.1) and self.thread.is_alive():
            pass

    def file_done(self, fd: int, on_durable, label: str = "", before=None) -> None:
        """Queue the file's fsync and close (`before` first), then `on_durable`."""
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
                        before()
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
            except OSError as exc:  # reported by `close`
                self.error = self.error or (exc, label)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
