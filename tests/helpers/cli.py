"""Run the real CLI in a child process, as a user would, and read its one error line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root


def dflash(
    *args: str, env: dict | None = None, timeout: float = 120, cwd: Path | str = ROOT
) -> subprocess.CompletedProcess:
    """Run ``python -m orchestrator ARGS`` (from the repository root unless `cwd` says
    otherwise) with wide columns; `env` adds to or replaces the inherited variables."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The only line on stderr, after checking there is exactly one and no traceback."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]
