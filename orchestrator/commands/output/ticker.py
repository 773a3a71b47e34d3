"""Progress off a terminal: a timestamped line per interval (`Ticker`), its ETA's pace (`Pace`)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

from orchestrator.commands.output.base import err_console, plain

TICK_SECONDS = 30.0


def tick_seconds() -> float:
    """Seconds between lines: ``$DFLASH_PROGRESS_SECONDS`` when above 0, else `TICK_SECONDS`."""
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
    """Done of total over the job's own clock (right when an attach replays old events)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.last: float | None = None
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
        """Seconds left at the pace so far; None before the first is done or after the last."""
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
    """The one line an eval prints once a tenth of its samples are done; None until then."""
    if not pace.total or pace.done < min(pace.total, max(2, math.ceil(pace.total / 10))):
        return None
    left = pace.left()
    if left is None or pace.elapsed() < 1:
        return None
    ends = time.strftime("%H:%M", time.localtime(time.time() + left))
    return (
        f"eval: first {pace.done} of {pace.total} {what} in {duration(pace.elapsed())}; "
        f"about {duration(left)} more (done about {ends})"
    )


class Ticker:
    """Prints `line()` on stderr every `interval` seconds from a daemon thread, off a terminal."""

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
            except Exception:
                continue
            if text:
                err_console.print(f"{time.strftime('%H:%M:%S')} {plain(text)}", soft_wrap=True)
                err_console.file.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
