"""The CLI's basics on a fresh install: --version, -h, `dflash env`, shell completion, and
a controller that runs without its optional parts (matplotlib, torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import orchestrator
from orchestrator.results.plots import MISSING
from tests.helpers.cli import ROOT, dflash

INVENTORY = ROOT / "inventory.yaml"


def test_version():
    proc = dflash("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"dflash {orchestrator.__version__}"


@pytest.mark.parametrize(
    "args", [(), ("hosts",), ("hosts", "check"), ("relay",), ("results", "plot"), ("env",)]
)
def test_dash_h_is_help_everywhere(args):
    short, long = dflash(*args, "-h"), dflash(*args, "--help")
    assert short.returncode == 0 and "Usage: dflash" in short.stdout, short.stderr
    assert short.stdout == long.stdout


def test_env_reports_versions_and_where_the_inventory_came_from(tmp_path):
    proc = dflash("env", "--json", env={"DFLASH_INVENTORY": str(INVENTORY)})
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["dflash"] == orchestrator.__version__
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    import torch
    import transformers

    assert info["packages"]["torch"] == torch.__version__
    assert info["packages"]["transformers"] == transformers.__version__
    assert info["packages"]["paramiko"] and info["packages"]["fabric"]
    assert info["openssh"].startswith("OpenSSH_")
    assert info["inventory"] == {
        "path": str(INVENTORY),
        "from": "$DFLASH_INVENTORY",
        "exists": True,
    }
    missing = dflash("env", "-i", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 0
    assert f"{tmp_path / 'nope.yaml'} (from --inventory; no such file)" in missing.stdout


def test_env_does_not_import_torch():
    code = (
        "import sys\nfrom orchestrator.environment import environment\n"
        "info = environment()\nassert info['packages']['torch'], info\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr


def test_shell_completion_script_for_the_calling_shell():
    """Typer detects the shell it is called from (here bash) and completes `dflash`."""
    line = f"{sys.executable} -m orchestrator --show-completion; true"
    proc = subprocess.run(
        ["bash", "-c", line],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "_DFLASH_COMPLETE=complete_bash" in proc.stdout
    assert "complete -o default -F _dflash_completion dflash" in proc.stdout


def test_controller_runs_without_matplotlib_and_torch():
    """The controller-only install (no `plot` extra, no torch): commands work, and plots
    are skipped with one line."""
    code = (
        "import sys\nsys.modules['matplotlib'] = None\nsys.modules['torch'] = None\n"
        "from orchestrator.results import plots\n"
        "assert plots.pyplot() is None and plots.pyplot() is None\n"
        "sys.argv = ['dflash', 'hosts', '-i', sys.argv[1], '--json']\n"
        "from orchestrator.cli import main\nmain()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(INVENTORY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [MISSING]
    assert {h["name"] for h in json.loads(proc.stdout)["hosts"]} == {"kpro6", "ct129"}
