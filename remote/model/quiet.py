"""transformers' notices and progress bars off for a stretch that tells the user nothing
(a meta-device build, the demo's tiny models); errors still show."""

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
