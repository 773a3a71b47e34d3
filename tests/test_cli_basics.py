"""The CLI's basics on a fresh install: --version, -h, `dflash env`, shell completion, and
a controller that runs without its optional parts (matplotlib, torch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

import orchestrator
from orchestrator.results.plots import MISSING
from tests.helpers.cli import ROOT, dflash

INVENTORY = ROOT / "inventory.example.yaml"


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


# What a newcomer does first to last: reach the hosts, move a checkpoint, look at the model,
# evaluate it, read the results; then the loop, the numerics check, and the helpers.
WORKFLOW = [
    "hosts",
    "relay",
    "probe-structure",
    "remote-eval",
    "jobs",
    "results",
    "follow",
    "parity",
    "online",
    "env",
    "demo",
]


def _section_rows(text: str, title: str) -> list[str]:
    """The rows of the help section called `title` (click's plain ``Title:`` heading and
    its indented lines, up to the next blank line)."""
    lines = text.splitlines()
    start = lines.index(f"{title}:")
    rows = []
    for ln in lines[start + 1 :]:
        if not ln.strip():
            break
        rows.append(ln.strip())
    return rows


def _all_commands(group, path=()):
    """(path, click command) for `group` and every command under it."""
    yield path, group
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _all_commands(cmd, (*path, name))


def test_help_lists_commands_in_workflow_order_on_one_line_each():
    """At a width that wraps nothing, each command is one row (its docstring's line breaks
    are not the help's), in the order a newcomer uses them."""
    proc = dflash("--help", env={"COLUMNS": "1000"})
    assert proc.returncode == 0, proc.stderr
    rows = _section_rows(proc.stdout, "Commands")
    assert [row.split()[0] for row in rows] == WORKFLOW


def test_no_help_shows_a_type_after_a_flag():
    """Flags take no value, so no help page shows one (Typer prints ``<bool>``), while
    options that take one keep it (``<path>``)."""
    import typer.main
    from typer.testing import CliRunner

    from orchestrator.cli import app

    runner = CliRunner()
    pages = 0
    for path, _ in _all_commands(typer.main.get_command(app)):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, (path, result.output)
        assert "--help" in result.output
        pages += 1
    assert pages >= len(WORKFLOW) + 8  # the root, every command and every subcommand
    relay = runner.invoke(app, ["relay", "--help"], env={"COLUMNS": "200"}).output
    assert "<path>" in relay  # --inventory still says what it takes


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


def _dist_info(folder, name: str, version: str, script: str):
    """An installed distribution as importlib.metadata finds it on `folder` (sys.path)."""
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[console_scripts]\ndflash = {script}\n")
    return folder


def test_our_distribution_is_not_named_dflash():
    """``dflash`` on PyPI is z-lab's DFlash reference (model code drafter teams install):
    ours is installed under another name, which `dflash env` reports with its version."""
    project = re.search(
        r"^\[project\]\nname = \"([^\"]+)\"", (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert project and project.group(1) == orchestrator.DISTRIBUTION != "dflash"
    info = json.loads(dflash("env", "--json").stdout)
    assert info["distribution"] == {
        "name": orchestrator.DISTRIBUTION,
        "version": metadata.version(orchestrator.DISTRIBUTION),
    }


def test_env_shows_z_lab_s_dflash_when_installed(tmp_path):
    """With z-lab's ``dflash`` installed beside us, `dflash env` names it and its version;
    without it, says so; this tool under its old name ``dflash`` is not taken for it."""
    zlab = _dist_info(tmp_path / "zlab", "dflash", "0.1.0", "dflash.cli:main")
    old = _dist_info(tmp_path / "old", "dflash", "0.0.9", "orchestrator.cli:main")
    for path, expected in ((zlab, "0.1.0"), (old, None), (tmp_path / "none", None)):
        pythonpath = f"{ROOT}{os.pathsep}{path}"
        proc = dflash("env", "--json", env={"PYTHONPATH": pythonpath})
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["packages"]["dflash"] == expected, path
        human = dflash("env", env={"PYTHONPATH": pythonpath}).stdout
        line = next(ln for ln in human.splitlines() if ln.startswith("dflash (z-lab)"))
        assert line.split()[-1] == (expected or "installed"), line  # "... not installed"


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
    assert {h["name"] for h in json.loads(proc.stdout)["hosts"]} == {"trainer", "evalbox"}
