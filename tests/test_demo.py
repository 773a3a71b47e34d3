"""`dflash demo` end to end: the library entry point and README's first command, on a
shared model cache.

The cache (`demo_cache`, conftest.py) is built once per test session through the demo's own
builder; the demo's first-run time on a fresh cache is measured by hand (docs/demo.md),
never asserted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers.cli import ROOT
from tests.helpers.images import png_size

pytestmark = pytest.mark.slow


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _naming(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and any(text in a for a in p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _port_closed(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return False
    except OSError:
        return True


class Recorder:
    """FollowEvents that keeps what the demo reports."""

    def __init__(self):
        from orchestrator.eval.follow.loop import FollowEvents

        class _E(FollowEvents):
            def message(inner, text):
                self.messages.append(text)

            def recorded(inner, entry):
                self.recorded.append(entry)

        self.events = _E()
        self.messages: list[str] = []
        self.recorded: list[dict] = []


def test_demo_library_runs_every_step_and_leaves_nothing_running(demo_cache, tmp_path):
    from orchestrator.demo import build
    from orchestrator.demo.run import DemoOptions, run_demo

    before = _children()
    rec = Recorder()
    keep = tmp_path / "kept"
    result = run_demo(DemoOptions(cache_dir=demo_cache, keep_dir=keep), rec.events)

    assert not result.built_now  # the session cache was used
    steps = [h["step"] for h in result.history]
    assert steps == list(build.STEPS)
    taus = [h["tau_per_sample_mean"] for h in result.history]
    assert all(h["state"] == "done" for h in result.history) and all(
        isinstance(t, float) for t in taus
    )
    assert taus[-1] > taus[0] + 0.5
    assert all(h["drafter_fits"] is True for h in result.history)  # probe-structure ran
    assert all(h["target_agreement"] == 1.0 for h in result.history)
    assert all(set(h["ddtree"]) == {"4", "8", "16"} for h in result.history)
    assert [e["checkpoint"] for e in rec.recorded] == [f"step-{s}" for s in build.STEPS]
    assert any("probe-structure" in m and "Qwen3_5" in m for m in rec.messages)
    w, h = png_size(result.plot)
    assert w >= 300 and h >= 200

    # The kept folder: inventory, relayed (published, manifest) drafters, pulled results.
    inv = (keep / "inventory.yaml").read_text()
    assert "demo-trainer" in inv and "transport: local" in inv
    hosts = yaml.safe_load(inv)["hosts"]  # each host names the python that has torch
    assert [h["python"] for h in hosts.values()] == [sys.executable, sys.executable]
    relayed = sorted(p.name for p in (keep / "eval" / "drafters").iterdir())
    assert [n for n in relayed if not n.startswith(".")] == [f"step-{s}" for s in build.STEPS]
    assert not [n for n in relayed if n.startswith(".partial-")]
    for h_ in result.history:
        run = json.loads((Path(h_["run_dir"]) / "result.json").read_text())
        assert run["inputs"]["ground_truth_source"]["kind"] == "sglang"

    # Nothing left running: no new child, nothing naming the demo folder, server closed.
    assert _children() <= before
    assert _naming(str(keep)) == []
    url = re.search(r"ground truth at (http://\S+)", " ".join(rec.messages)).group(1)
    assert _port_closed(url)


# README's first command, as a newcomer runs it: no venv activated, the system's PATH.
DEMO_SH = "bash scripts/demo.sh"


def test_demo_sh_prints_tau_per_step(demo_cache):
    """`bash scripts/demo.sh` runs the venv's dflash without activating it, under the
    clean PATH of a fresh machine (whose python3 has no torch): its set-up finds the venv
    ready, and the demo's local hosts run the venv's python, not PATH's."""
    from orchestrator.demo import build

    env = {
        **os.environ,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "DFLASH_VENV": sys.prefix,  # the venv running these tests, which set-up made
        "COLUMNS": "120",
        "DFLASH_CACHE_DIR": str(demo_cache),
    }
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        shlex.split(DEMO_SH),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    taus = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+step-(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)", line)
        if m:
            taus[int(m.group(1))] = float(m.group(3))
    assert sorted(taus) == list(build.STEPS), proc.stdout
    assert taus[build.STEPS[-1]] > taus[build.STEPS[0]]
    plot = re.search(r"^plot: (\S+)", proc.stdout, re.M).group(1)
    assert png_size(Path(plot))[0] >= 300
    assert Path(plot).is_relative_to(demo_cache / "demo" / "last-run")
    # The temporary demo folder is gone and nothing from it runs.
    folder = Path(re.search(r"inventory: (\S+)/inventory.yaml", proc.stderr).group(1))
    assert folder.name.startswith("dflash-demo-") and not folder.exists()
    assert _naming(str(folder)) == []
    # transformers' own bars and notices (the server's model load) stay out of its output
    for noise in ("Loading weights", "Writing model shards", "[transformers]"):
        assert noise not in proc.stderr + proc.stdout, noise
    # nothing silent between the relay and the eval: the probe says it runs
    assert re.search(r"step-0: probe-structure on demo-eval: does the drafter fit", proc.stderr)
    assert re.search(r"; \d+s in all: set-up \d+s, models \d+s, hosts and server", proc.stdout)


def test_demo_sh_json_is_json_alone_on_stdout_and_counts_the_setup(demo_cache):
    """`bash scripts/demo.sh --json`: the set-up's lines go to stderr, so stdout parses as
    the demo's JSON (before: `setup: ready for the demo: ...` came first on stdout), and
    its times count the set-up `demo.sh` ran (before: a `setup 1s` that was not it)."""
    from orchestrator.demo import build

    env = {
        **os.environ,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "DFLASH_VENV": sys.prefix,
        "DFLASH_CACHE_DIR": str(demo_cache),
    }
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [*shlex.split(DEMO_SH), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert [h["step"] for h in out["history"]] == list(build.STEPS)
    first, last = out["history"][0], out["history"][-1]
    assert last["tau_per_sample_mean"] > first["tau_per_sample_mean"]
    assert "setup: ready for the demo: " in proc.stderr
    seconds = out["seconds"]
    assert set(seconds) == {"setup", "models", "hosts", "relay_probe_eval", "total"}
    assert seconds["total"] >= seconds["setup"] + seconds["relay_probe_eval"]


def test_models_are_cached_by_version_and_rebuilt_only_when_fresh(demo_cache):
    from orchestrator.demo import build

    base = demo_cache / "demo"
    again = build.ensure_assets(base=demo_cache)
    assert not again.built_now and again.root == base / build.version()
    assert [p.name for p in base.iterdir() if ".partial-" in p.name] == []
    assert (again.target / "config.json").is_file()
    assert (again.target / "tokenizer.json").is_file()
    assert [c.name for c in again.checkpoints] == [f"step-{s}" for s in build.STEPS]
    for c in again.checkpoints:
        cfg = json.loads((c / "config.json").read_text())
        assert cfg["dflash_config"]["target_layer_ids"] and cfg["block_size"] == build.BLOCK_SIZE
    stamp = (again.root / "demo.json").stat().st_mtime_ns
    assert (build.ensure_assets(base=demo_cache).root / "demo.json").stat().st_mtime_ns == stamp


def test_demo_refuses_a_non_empty_keep_dir(tmp_path):
    from tests.helpers.cli import dflash, one_error_line

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "file").write_text("mine")
    proc = dflash("demo", "--keep-dir", str(tmp_path / "x"))
    assert proc.returncode != 0
    assert "not an empty folder" in one_error_line(proc)
    assert (tmp_path / "x" / "file").read_text() == "mine"
