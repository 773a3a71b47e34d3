"""Progress off a terminal: a line at a steady interval, and the pace behind its ETA.

On a terminal the rich bars redraw in place; off one (a pipe, a log file, CI) they print
nothing until they stop, so a long command would say nothing for minutes. `Ticker` prints
one timestamped line every `tick_seconds()` (30 s; ``DFLASH_PROGRESS_SECONDS`` sets
another) from what a view knows then: samples done of total, tokens/s, the time left.
`Pace` is that arithmetic, from the job's own event times (right when an attach replays
events that happened while nobody watched)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

from orchestrator.commands.output.base import err_console, plain

TICK_SECONDS = 30.0


def tick_seconds() -> float:
    """How often a progress line prints off a terminal: ``$DFLASH_PROGRESS_SECONDS`` when it
    is a number above 0, else `TICK_SECONDS`."""
    try:
        value = float(os.environ.get("DFLASH_PROGRESS_SECONDS", ""))
    except ValueError:
        return TICK_SECONDS
    return value if math.isfinite(value) and value > 0 else TICK_SECONDS


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Pace:
    """Done of total over the job's own clock: the rate and the time left."""

    def __init__(self) -> None:
        self.started: float | None = None  # the job's time of its first event here
        self.last: float | None = None  # its time of the latest one
        self.done = 0
        self.total: int | None = None
        self.tokens = 0

    def update(self, when: float | None, done: int, total: int | None, tokens: int = 0) -> None:
        when = when or time.time()
        self.started = self.started if self.started is not None else when
        self.last = when
        self.done, self.total = done, total or self.total
        self.tokens += tokens

    def elapsed(self) -> float:
        if self.started is None or self.last is None:
            return 0.0
        return max(1e-3, self.last - self.started)

    def left(self) -> float | None:
        """Seconds left at the pace so far (None before the first one is done, and once
        the last one is)."""
        if not self.done or not self.total or self.done >= self.total or self.started is None:
            return None
        return self.elapsed() / self.done * max(0, self.total - self.done)

    def rate(self) -> str:
        return f"{self.tokens / self.elapsed():,.0f} tok/s" if self.tokens else ""

    def eta(self) -> str:
        left = self.left()
        return "" if left is None else f"about {duration(left)} left"

    def count(self, what: str) -> str:
        return f"{self.done}/{self.total if self.total else '?'} {what}"


def first_estimate(pace: Pace, what: str = "samples") -> str | None:
    """The one line an eval prints once its first samples are done: how long they took and
    about how long the rest will (None until enough are done to say: a tenth, at least 2
    where there are 2)."""
    if not pace.total or pace.done < min(pace.total, max(2, math.ceil(pace.total / 10))):
        return None
    left = pace.left()
    if left is None or pace.elapsed() < 1:  # all done at once: nothing to estimate
        return None
    ends = time.strftime("%H:%M", time.localtime(time.time() + left))
    return (
        f"eval: first {pace.done} of {pace.total} {what} in {duration(pace.elapsed())}; "
        f"about {duration(left)} more (done about {ends})"
    )


class Ticker:
    """Prints `line()` (when not None) on stderr every `interval` seconds while started,
    only when stderr is not a terminal and `enabled`; a daemon thread, stopped by `stop`."""

    def __init__(
        self, line: Callable[[], str | None], enabled: bool = True, interval: float | None = None
    ):
        self.line = line
        self.interval = interval or tick_seconds()
        self.enabled = enabled and not err_console.is_terminal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Ticker:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="progress-ticker", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                text = self.line()
            except Exception:  # a view mid-update: the next tick says it
                continue
            if text:
                err_console.print(f"{time.strftime('%H:%M:%S')} {plain(text)}", soft_wrap=True)
                err_console.file.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
