"""Every table of `dflash results` fits the terminal at 60 and 80 columns (#48 item 12:
`results list`'s parity table was 83 columns at 80 and at 60), with no id or number cut:
tables go compact with wrapped headers, then leave out optional columns (a caption names
them), then narrow their wrapping columns. The CLI runs in a child process at each width."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.cli import dflash
from tests.helpers.runs import edit_result, make_run

WIDTHS = (60, 80)
PARITY = "20261201-180102-parity-5d1c"
RUNS = ("20261201-162519-step-150-ac0f", "20261201-170102-step-300-5d1c")


def _parity(root: Path) -> None:
    """A parity run as `dflash parity` leaves it: two hosts, their dtype, device, attention."""
    layer = {
        "tokens": 96,
        "cosine": {"p50": 0.9999871, "p1": 0.9993456, "min": 0.9981234},
        "rel_l2": {"p50": 3.93e-4, "p99": 1.27e-3, "max": 4.5e-3},
        "max_abs": {"p99": 2.1e-2, "max": 8.8e-2},
    }
    cap = {"dtype": "bfloat16", "device": {"device": "cpu"}, "attn": "sdpa"}
    doc = {
        "schema": "dflash.parity/1",
        "samples": 8,
        "layers": [{"layer": i, **layer} for i in range(3)],
        "top1_agreement": {"match": 7, "total": 8, "rate": 0.875},
        "hosts": {"a": "evalbox", "b": "trainer"},
        "captures": {"a": cap, "b": {**cap, "device": {"device": "cuda:0"}}},
        "drafter": {"tau_a": 1.904, "tau_b": 1.951, "delta_tau": 0.047},
        "created": 3e9,
    }
    (root / PARITY).mkdir(parents=True)
    (root / PARITY / "result.json").write_text(json.dumps(doc))


def _costs(doc: dict) -> None:
    """Round costs as a host records them: the DDTree trade-off table gets every column."""
    doc["inputs"]["block_size"] = 4
    doc["timings"]["round_costs"] = {
        "target_step_s": 0.0102,
        "drafter_round_s": 0.0031,
        "target_verify_s": {"4": 0.0121, "3": 0.0113, "5": 0.0125},
        "tree_verify_s": {"2": 0.0115, "4": 0.0133},
        "repeats": 5,
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fit") / "results"
    cats = ("mt_bench", "translation", "summarization")
    for i, (run, skill) in enumerate(zip(RUNS, (0.4, 0.8), strict=True)):
        step = 150 * (i + 1)
        kw = {"skill": skill, "created": 1e9 + i, "samples": 9, "categories": cats}
        folder = make_run(root, run, f"step-{step}", step, **kw)
        edit_result(folder, _costs)
    _parity(root)
    return root


def _fits(proc, columns: int) -> str:
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    wide = [ln for ln in out.splitlines() if len(ln) > columns]
    assert not wide, f"{len(wide)} lines over {columns} columns:\n" + "\n".join(wide)
    assert "…" not in out, out
    return out


@pytest.mark.parametrize("columns", WIDTHS)
def test_results_list_fits_with_every_id_and_number_whole(root, columns):
    proc = dflash("results", "list", "--results-dir", str(root), env={"COLUMNS": str(columns)})
    out = _fits(proc, columns)
    assert re.search(rf"^{PARITY}\s+\S.*\s0\.001\s+(87\.5%\s+)?0\.047\s*$", out, re.M), out
    for run in RUNS:
        assert re.search(rf"^{run}\s+\d+\s+\d\.\d{{3}}\b", out, re.M), out


@pytest.mark.parametrize("columns", WIDTHS)
def test_results_show_fits_with_every_id_and_number_whole(root, columns):
    from orchestrator.results import store

    run = store.load_run(root / RUNS[1])
    proc = dflash(
        "results", "show", RUNS[1], "--results-dir", str(root), env={"COLUMNS": str(columns)}
    )
    out = _fits(proc, columns)
    assert RUNS[1] in out
    assert f"{run.metrics['tau_per_sample_mean']:.3f}" in out
    for t in ("tau by category", "acceptance histogram", "per-position acceptance"):
        assert t in re.sub(r"\s+", " ", out), t
    assert re.search(r"^\s*chain \(3 drafts\)\s.*\d\.\d{3}", out, re.M), out  # trade-off rows
    assert "12.100" in out or "left out at this width" in out  # the chain's verify ms


@pytest.mark.parametrize("columns", WIDTHS)
def test_results_compare_and_its_gate_fit(root, columns):
    proc = dflash(
        "results", "compare", *RUNS, "--fail-below", "0.5", "--gate-by", "category",
        "--results-dir", str(root), env={"COLUMNS": str(columns)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    body = out.splitlines()[:-1]  # the gate's line stays one line, as CI greps it
    assert all(len(ln) <= columns for ln in body) and "…" not in out, out
    assert f"A: {RUNS[0]}" in out and f"B: {RUNS[1]}" in out
    assert re.search(r"^tau\s+\d\.\d{3}\s+\d\.\d{3}\s+\+\d\.\d{3}\s+\[", out, re.M), out
    assert out.splitlines()[-1].startswith("gate passed: tau ")


def test_each_command_in_one_process_fits_its_own_width(root):
    """Consoles outlive a command in one process (tests, a notebook): the second command's
    COLUMNS holds, not the first's (CI saw a parity table drawn at an earlier test's width)."""
    from typer.testing import CliRunner

    from orchestrator.cli import app

    runner = CliRunner()
    argv = ["results", "show", RUNS[1], "--results-dir", str(root)]
    narrow = runner.invoke(app, argv, env={"COLUMNS": "60"})
    wide = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert narrow.exit_code == 0 and wide.exit_code == 0, narrow.output + wide.output
    assert max(map(len, narrow.stdout.splitlines())) <= 60, narrow.stdout
    assert "left out at this width" in narrow.stdout, narrow.stdout
    assert "left out" not in wide.stdout and "12.100" in wide.stdout, wide.stdout
