"""How long a host-side relay command waits on the controller: a deadline on silence.

A lock holder waits for the controller's next request, a receiver for the bytes of its
frames, a sender for the controller to take its bytes. A controller that dies closes its
connection, and these commands end at the EOF or broken pipe; one that vanishes without
closing it (its network gone, its machine asleep) would leave them blocked, and the
holder's lock held, for as long as the TCP connection lingers (hours). `Patience` bounds
such a wait: the command's reads and writes on the controller's pipes go through it
(`Patience.call`), and a watchdog thread that sees the main thread blocked in one for
`limit` seconds interrupts it (a signal to that thread, whose handler raises `Stalled`),
so the command ends with one line and its lock goes with it. The controller pings an
idle holder well within the limit (`remote.relay.lock.serve`), so only a vanished
controller meets it.

Per read or write a clock read and a flag set and cleared: nothing measurable on the data
path.
"""

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
    """A deadline on silence for the main thread's reads and writes on the controller's
    pipes (module docstring). Create it in the main thread: the signal handler is
    installed there."""

    def __init__(self, limit: float):
        self.limit = limit
        self.blocked = False  # the main thread is inside a `call` now
        self.since = time.monotonic()  # when that call began
        self._main = threading.get_ident()
        signal.signal(_SIGNAL, self._interrupt)
        threading.Thread(target=self._watch, daemon=True, name="patience").start()

    def call(self, fn: Callable, *args):
        """`fn(*args)`, one read or write that may block on the controller: it may take
        `limit` seconds at most."""
        self.since = time.monotonic()
        self.blocked = True
        try:
            return fn(*args)
        finally:
            self.blocked = False

    def _silent(self) -> bool:
        """Whether the main thread has been blocked in one call for `limit` seconds."""
        return self.blocked and time.monotonic() - self.since >= self.limit

    def _watch(self) -> None:
        tick = min(1.0, self.limit / 4)
        while True:
            time.sleep(tick)
            if self._silent():
                signal.pthread_kill(self._main, _SIGNAL)  # its blocking call ends (EINTR)

    def _interrupt(self, *_) -> None:
        # In the main thread; checked again: the call may have returned since the signal.
        if self._silent():
            self.blocked = False
            raise Stalled(
                f"nothing from the relay's controller for {self.limit:g} s; "
                "it is gone (its connection never closed)"
            )
