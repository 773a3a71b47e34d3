"""What the suite does when a real part it needs (Slurm, vLLM) is not on this machine."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(why: str) -> NoReturn:
    """Skip the calling test, saying `why`; under CI (``CI`` set, as `.ci/run` sets it),
    whose set-up installs every real part, fail it: a skip there would hide a missing step
    of the set-up behind a green run."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI installs it: a missing part is a set-up bug)", pytrace=False)
    pytest.skip(why)
