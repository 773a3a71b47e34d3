"""`results show` says how a run's settings differ from another run of the same checkpoint
in the results folder (#48 item 10: the demo's tau 1.905 and the user's 1.746 of one
checkpoint, 8 samples with a server against 25 local ones, and nothing said why). Run
folders come from `tests.helpers.runs`; the CLI runs in a child process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import dflash
from tests.helpers.runs import edit_result, make_run


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def show(root: Path, run: str, *args: str):
    proc = dflash("results", "show", run, "--results-dir", str(root), *args)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def root(tmp_path) -> Path:
    """The demo's run of step-150 (8 samples, a server's ground truth, float32, 64 tokens)
    and the user's (25 samples, local ground truth, bfloat16, 256 tokens), and a later
    run of another checkpoint."""
    root = tmp_path / "results"
    demo = make_run(root, "demo-step-150", "step-150", 150, samples=8, created=1e9)
    mine = make_run(root, "mine-step-150", "step-150", 150, samples=25, created=2e9, skill=0.4)
    make_run(root, "mine-step-300", "step-300", 300, samples=25, created=3e9)
    _edit(demo / "spec.json", lambda d: d.update(sampling={"max_new_tokens": 64}))
    _edit(mine / "spec.json", lambda d: d.update(sampling={"max_new_tokens": 256}))
    edit_result(mine, lambda d: d["environment"].update(dtype="bfloat16"))
    (mine / "ground_truth.json").write_text(json.dumps({"kind": "local", "cached": False}))
    return root


def test_show_says_how_the_settings_differ_from_the_checkpoints_other_run(root):
    from orchestrator.results import store

    tau = {r.run_id: r.metrics["tau_per_sample_mean"] for r in store.list_runs(root)}
    out = show(root, "mine-step-150").stdout
    (line,) = [ln for ln in out.splitlines() if "settings differ" in ln]
    assert line.startswith("settings differ from demo-step-150, this checkpoint's other run")
    assert f"tau {tau['demo-step-150']:.3f} there, {tau['mine-step-150']:.3f} here" in line
    said = line.split("here vs there: ")[1]
    assert said.split(", ") == [
        "samples 25 vs 8",
        "max tokens 256 vs 64",
        "dtype bfloat16 vs float32",
        "ground truth local vs sglang http://127.0.0.1:1/",
    ]
    doc = json.loads(show(root, "mine-step-150", "--json").stdout)
    assert doc["beside"]["run_id"] == "demo-step-150"
    assert {d["setting"]: (d["this"], d["other"]) for d in doc["beside"]["differences"]} == {
        "samples": (25, 8),
        "max tokens": (256, 64),
        "dtype": ("bfloat16", "float32"),
        "ground truth": ("local", "sglang http://127.0.0.1:1/"),
    }
    # the demo's run: the same differences, seen from the other side
    line = next(ln for ln in show(root, "demo-step-150").stdout.splitlines() if "differ" in ln)
    assert "samples 8 vs 25" in line and "ground truth sglang http://127.0.0.1:1/ vs local" in line


def test_a_run_alone_or_alike_says_so_or_nothing(root, tmp_path):
    out = show(root, "mine-step-300").stdout  # no other run of step-300
    assert "settings differ" not in out and "same settings" not in out
    alike = tmp_path / "alike"
    make_run(alike, "a", "step-7", 7, created=1e9)
    make_run(alike, "b", "step-7", 7, created=2e9, skill=0.9)
    out = show(alike, "b").stdout
    assert "same settings as a, this checkpoint's other run (tau " in out
