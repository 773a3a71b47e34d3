"""The walk's heap: large buffers back to the OS when freed (`bound_heap`)."""

from __future__ import annotations

import ctypes
import ctypes.util


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 16 * 2**20


def bound_heap() -> None:
    """Serve every buffer of 16 MiB or more from its own mapping, returned to the OS on
    free, and the smaller ones from the heap, kept for reuse.

    glibc otherwise raises that threshold to the largest buffer freed so far and serves
    later ones from its heap, where the target forward's, the drafter batches' and the
    head's differently sized buffers fragment it: the phases' working sets then stack up
    in the peak RSS, more so the longer the sequence, instead of taking turns. A lower
    threshold maps (and page-faults in) the walk's many small per-call buffers afresh
    on every call, which costs the drafter more CPU than its arithmetic in small calls
    (benchmarks/results.md, eval-heap). The heap's top is trimmed only past twice the
    threshold, so it is not given back and faulted in again between two calls. A no-op
    where the C library has no ``mallopt`` (musl, macOS)."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
