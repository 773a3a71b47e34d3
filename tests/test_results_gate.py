"""`dflash results compare BASE NEW` as a CI gate (#48): exit 1 with one line naming the
metric, the group and by how much when NEW falls below a stated fraction of BASE or its
paired interval lies below 0; exit 0 with one line otherwise; the JSON says the same.
Run folders come from `tests.helpers.runs` (the engine's own metrics over seeded
records), the CLI runs in a child process as CI would run it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.cli import dflash, one_error_line
from tests.helpers.runs import edit_result, make_run

CATS = ("qa", "math")


def _records(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / "samples.jsonl").read_text().splitlines()]


def _tau(recs: list[dict]) -> float:
    """tau per-sample mean, computed here from the rounds."""
    return sum(sum(r["rounds"]) / len(r["rounds"]) for r in recs) / len(recs)


def compare(root: Path, *args: str):
    return dflash("results", "compare", "base", "new", "--results-dir", str(root), *args)


@pytest.fixture
def worse(tmp_path) -> Path:
    root = tmp_path / "results"
    make_run(root, "base", "step-200", 200, skill=0.8, samples=8, categories=CATS)
    make_run(root, "new", "step-300", 300, skill=0.3, samples=8, categories=CATS)
    return root


def test_a_new_run_below_the_stated_fraction_fails_in_one_line(worse):
    base, new = _tau(_records(worse / "base")), _tau(_records(worse / "new"))
    assert new < 0.95 * base
    proc = compare(worse, "--fail-below", "0.95")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert line.startswith("gate failed: tau of new: "), line
    assert f"{new:.3f} vs BASE {base:.3f}" in line and f"{new / base:.3f} of BASE" in line
    assert "below 0.95" in line

    proc = compare(worse, "--fail-below", "0.95", "--json")
    assert proc.returncode == 1
    gate = json.loads(proc.stdout)["gate"]
    assert gate["passed"] is False and gate["line"] == line
    (check,) = gate["checks"]
    assert check["ratio"] == pytest.approx(new / base) and check["failed"]


def test_a_run_as_good_passes_with_one_line_and_exit_0(worse):
    proc = dflash(
        "results", "compare", "new", "base", "--fail-below", "0.95", "--fail-if-worse",
        "--results-dir", str(worse),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    base, new = _tau(_records(worse / "new")), _tau(_records(worse / "base"))
    assert re.fullmatch(
        rf"gate passed: tau {new:.3f} vs BASE {base:.3f} \(\+\d\.\d{{3}}, interval "
        r"\[\+\d\.\d{3}, \+\d\.\d{3}\]\) over 8 paired samples",
        last,
    ), last
    doc = json.loads(
        dflash(
            "results", "compare", "new", "base", "--fail-below", "0.95", "--json",
            "--results-dir", str(worse),
        ).stdout
    )  # fmt: skip
    assert doc["gate"]["passed"] is True and doc["gate"]["line"].startswith("gate passed")


def test_a_drop_beyond_the_paired_interval_fails_and_a_tie_does_not(worse):
    proc = compare(worse, "--fail-if-worse")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert re.search(r"interval \[-\d\.\d{3}, -\d\.\d{3}\] below 0", line), line
    (worse / "new" / "samples.jsonl").write_text((worse / "base" / "samples.jsonl").read_text())
    proc = compare(worse, "--fail-if-worse")
    assert proc.returncode == 0, proc.stderr
    assert (
        "gate passed: tau" in proc.stdout and "(+0.000, interval [+0.000, +0.000])" in proc.stdout
    )


def test_per_category_the_gate_names_the_category_that_fell(tmp_path):
    """NEW better overall, worse in one category: the gate passes as a whole and fails
    with --gate-by category, naming it."""
    root = tmp_path / "results"
    make_run(root, "base", "step-200", 200, skill=0.5, samples=8, categories=CATS)
    make_run(root, "new", "step-300", 300, skill=0.95, samples=8, categories=CATS)
    recs = _records(root / "new")
    for r in recs:
        if r["category"] == "math":  # every draft rejected in math
            r["rounds"] = [1] * len(r["rounds"])
            r["tau"] = 1.0
    (root / "new" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    base = _records(root / "base")
    whole = _tau(recs) / _tau(base)
    cat = [r for r in recs if r["category"] == "math"]
    math = _tau(cat) / _tau([r for r in base if r["category"] == "math"])
    assert math < whole
    bound = f"{(math + whole) / 2:.3f}"
    assert compare(root, "--fail-below", bound).returncode == 0
    proc = compare(root, "--fail-below", bound, "--gate-by", "category")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert line.startswith("gate failed: tau (category math) of new: "), line
    assert f"{math:.3f} of BASE, below {float(bound):g}" in line


def test_runs_that_cannot_be_paired_fail_the_gate(worse):
    edit_result(worse / "new", lambda d: d["inputs"].update(ground_truth_sha256="e" * 64))
    proc = compare(worse, "--fail-below", "0.5")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert line.startswith("gate failed: new is not comparable with base: different ground")


@pytest.mark.parametrize(
    "args, said",
    [
        (["--gate-by", "category"], "--gate-metric and --gate-by need --fail-below"),
        (["--fail-below", "0.95", "--gate-by", "tier"], "--gate-by 'tier' is unknown"),
        (["--fail-below", "0.95", "--gate-metric", "rounds"], "--gate-metric 'rounds' is not"),
        (["--fail-below", "-1"], "--fail-below -1.0 is not a fraction"),
    ],
)
def test_a_gate_asked_wrongly_is_one_line(worse, args, said):
    proc = compare(worse, *args)
    assert proc.returncode != 0
    assert said in one_error_line(proc)
