"""transformers' own notices and progress bars, off for a stretch of work and back after.

Kept to the stretches whose notices say nothing to the user: building a model on the meta
device (no weights, so no load report worth reading) and the demo's in-process tiny
models. Errors still show. Outside them transformers logs as the process set it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def transformers_quiet() -> Iterator[None]:
    """transformers' verbosity at ERROR and its progress bars off, as they were after."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
