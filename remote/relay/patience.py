"""A deadline on silence for a host relay command's reads and writes to the controller,
so a vanished controller leaves no lock held (docs/relay.md, "A stream that ends early")."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from remote.errors import UserError

_SIGNAL = signal.SIGUSR1


class Stalled(UserError):
    """No sign of life from the controller within the limit."""


class Patience:
    """Bounds the main thread's blocking calls on the controller; create it in that thread."""

    def __init__(self, limit: float):
        self.limit = limit
        self.blocked = False
        self.since = time.monotonic()
        self._main = threading.get_ident()
        signal.signal(_SIGNAL, self._interrupt)
        threading.Thread(target=self._watch, daemon=True, name="patience").start()

    def call(self, fn: Callable, *args):
        """`fn(*args)`, ended after `limit` seconds blocked."""
        self.since = time.monotonic()
        self.blocked = True
        try:
            return fn(*args)
        finally:
            self.blocked = False

    def _silent(self) -> bool:
        return self.blocked and time.monotonic() - self.since >= self.limit

    def _watch(self) -> None:
        tick = min(1.0, self.limit / 4)
        while True:
            time.sleep(tick)
            if self._silent():
                signal.pthread_kill(self._main, _SIGNAL)  # its blocking call ends (EINTR)

    def _interrupt(self, *_) -> None:
        # The call may have returned since the signal.
        if self._silent():
            self.blocked = False
            raise Stalled(
                f"nothing from the relay's controller for {self.limit:g} s; "
                "it is gone (its connection never closed)"
            )
