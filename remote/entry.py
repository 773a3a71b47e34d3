"""How this bundle runs itself again: the argv of a child process and its environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def self_command() -> list[str]:
    """The argv prefix that runs this bundle (or source tree) again with the same python."""
    pkg = Path(__file__).resolve().parent
    bundle = pkg.parent
    if bundle.is_file():
        return [sys.executable, str(bundle)]
    return [sys.executable, "-m", "remote"]


def source_env() -> dict[str, str]:
    """Environment for child processes; from a source tree, keep `remote` importable."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent
    if root.is_dir():
        env["PYTHONPATH"] = str(root) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
    return env
