"""A child process that ends with its parent (Linux's ``PR_SET_PDEATHSIG``), so a parent
killed outright leaves no child running on."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A function for the child (a ``preexec_fn``, or after ``os.fork``) asking for `sig`
    when its parent dies; None where there is no such call. libc is looked up here."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, parent = 1, os.getpid()

    def in_child() -> None:
        prctl(pr_set_pdeathsig, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # died before the call: no signal will come
            os._exit(1)

    return in_child
