"""Long commands talk off a terminal: a timestamped progress line at a steady interval
(samples done of total, tokens/s, time left), the eval's one-line outline before it runs
and its estimate once its first samples are done; on a terminal the bars alone.

The views are driven as the library drives them, in this process, their stderr a buffer
(not a terminal), the interval shortened (``DFLASH_PROGRESS_SECONDS``); then one real
``dflash remote-eval`` on a local host, its stderr a pipe."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace as NS

import pytest

from remote.protocol.metrics import HEADLINE
from tests.helpers.cli import ROOT

TICK = r"^\d\d:\d\d:\d\d "


@pytest.fixture
def stderr(monkeypatch):
    """What the CLI's stderr console prints, into a buffer that is not a terminal; the
    progress interval 0.1 s."""
    from orchestrator.commands.output import base

    monkeypatch.setenv("DFLASH_PROGRESS_SECONDS", "0.1")
    con = base.err_console
    buf = io.StringIO()
    monkeypatch.setattr(con, "file", buf)
    return buf


def shows(buf: io.StringIO, pattern: str, limit: float = 30.0) -> str:
    """The first line of `buf` matching `pattern`, waiting for a ticker to print it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = re.search(pattern, buf.getvalue(), re.M)
        if found:
            return found.group(0)
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in:\n{buf.getvalue()}")


def test_an_eval_off_a_terminal_says_what_it_does_and_ticks_with_its_time_left(stderr):
    from orchestrator.commands import output

    with output.LiveProgress() as live:
        live({"event": "outline", "text": "job J on evalbox: 8 samples (all of chat) x ..."})
        live({"event": "phase", "phase": "ground_truth", "source": "local"})
        shows(stderr, TICK + r"eval: making or reading the ground truth$")
        live({"event": "ground_truth", "done": 4, "total": 8, "time": 990.0})
        live({"event": "start", "samples": 8, "time": 1000.0})
        for n in (1, 2, 3):
            live({"event": "sample", "done": n, "total": 8, "tokens": 40, HEADLINE: 2.5,
                  "time": 1000.0 + 10 * n})  # fmt: skip
        line = shows(stderr, TICK + r"eval: 3/8 samples.*")
    assert line.endswith("eval: 3/8 samples, 4 tok/s, tau 2.500, about 50s left"), line
    out = stderr.getvalue()
    assert "job J on evalbox: 8 samples (all of chat) x ...\n" in out
    first = re.findall(r"^eval: first .*$", out, re.M)
    assert len(first) == 1 and first[0].startswith(
        "eval: first 2 of 8 samples in 20s; about 1m00s more (done about "
    ), out
    assert "\r" not in out


def test_sharded_parity_and_relay_views_tick_too(stderr):
    from orchestrator.commands import output

    with output.ShardProgress() as shards:
        shards.set_total(8)
        for host in ("east", "west"):
            shards(host, {"event": "shard", "samples": 4})
            for i in range(2):
                shards(host, {"event": "sample", "tokens": 3, HEADLINE: 2.0, "time": 100.0 + i})
        line = shows(stderr, TICK + r"eval: 4/8 samples.*")
    assert line.endswith("(east 2/4, west 2/4)") and "about" in line, line
    with output.ParityLines() as lines:
        lines.started("capture evalbox", NS(job_id="j1", host="evalbox"))
        lines("capture evalbox", {"event": "sample", "done": 3, "total": 8})
        shows(stderr, TICK + r"parity: capture evalbox 3/8$")
    bar = output.RelayProgress()
    bar.start(4 * 2**30, 2)
    bar.advance(2**30)
    bar.file_done("step_1", "a.safetensors")
    try:
        shows(stderr, TICK + r"relay: 1\.00 of 4\.00 GiB, 1/2 files")
    finally:
        bar.stop()


def test_on_a_terminal_only_the_bars_show(monkeypatch):
    from orchestrator.commands.output import base
    from orchestrator.commands.output.ticker import Ticker

    monkeypatch.setattr(base.err_console, "_force_terminal", True)
    assert Ticker(lambda: "x").enabled is False
    monkeypatch.setattr(base.err_console, "_force_terminal", False)
    assert Ticker(lambda: "x").enabled is True


@pytest.mark.slow
def test_remote_eval_off_a_terminal_opens_with_its_outline_and_ticks(
    tmp_path, tiny_target, trained_drafters
):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        json.dumps(
            {
                "hosts": {
                    "here": {
                        "transport": "local",
                        "python": sys.executable,
                        "workdir": str(tmp_path / "work"),
                        "roles": {
                            "eval": {
                                "drafters": str(trained_drafters),
                                "target_model": str(tiny_target),
                                "ground_truth_kind": "local",
                                "dtype": "float32",
                            }
                        },
                    }
                },
                "defaults": {"eval_host": "here", "results_dir": str(tmp_path / "res")},
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DFLASH_PROGRESS_SECONDS": "0.5"}
    argv = ["remote-eval", "-c", "step-12", "--prompts", "code", "--samples", "6"]
    argv += ["--max-new-tokens", "24", "-i", str(inv)]
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    job = re.search(r"^started job (\S+) on here", err, re.M).group(1)
    outline = re.search(rf"^job {job} on here: .*$", err, re.M).group(0)
    assert re.fullmatch(
        rf"job {job} on here: 6 samples \(of code's \d+, seed 0\) x up to 24 new tokens, "
        r"float32, DDTree budgets 8, 16, 32, 64; ground truth: the target's own greedy "
        r"completions, made on the host \(reused where cached on the host\)",
        outline,
    ), outline
    assert re.search(r"^threads: 1, the target's weights being [\d.]+ MiB", err, re.M), err
    assert re.search(TICK + r"eval: ", err, re.M), err
    assert "\r" not in err
