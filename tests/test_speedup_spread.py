"""The speedup estimate carries the spread of the host's round-cost trials
(`orchestrator.results.speedup`): its range in the run's summary line, and no estimate,
one line saying why, where one part's trials are more than SPREAD_LIMIT apart."""

from __future__ import annotations

import pytest

from orchestrator.results import speedup, summary
from orchestrator.results import store as res
from tests.helpers.cli import dflash
from tests.helpers.runs import edit_result, make_run

COSTS = {
    "context_tokens": 30,
    "target_step_s": 0.010,
    "target_verify_s": {"4": 0.012, "3": 0.011, "5": 0.013},
    "drafter_round_s": 0.003,
}


def with_costs(tmp_path, spread: dict):
    root = tmp_path / "results"
    make_run(root, "run-a", "step-300", 300, skill=0.7, samples=6)
    costs = {**COSTS, "spread": spread}
    edit_result(root / "run-a", lambda d: d["timings"].update(round_costs=costs))
    edit_result(root / "run-a", lambda d: d["inputs"].update(block_size=4))
    return root, res.load_run(root / "run-a")


def test_the_estimate_shows_the_range_its_trials_give(tmp_path):
    spread = {
        "target_step_s": [0.010, 0.011],
        "target_verify_s/4": [0.012, 0.014],
        "drafter_round_s": [0.003, 0.004],
    }
    root, run = with_costs(tmp_path, spread)
    tau = run.metrics["tau_token_weighted"]
    est, ends = speedup.estimate(run), speedup.estimate_range(run)
    assert est["chain"] == pytest.approx(tau * 0.010 / 0.015)
    assert ends["chain"] == pytest.approx((tau * 0.010 / 0.018, tau * 0.011 / 0.015))
    # DDTree-4 verifies 5 tokens, not timed here (read off the others): the step and the
    # drafter's range alone
    tau4 = run.metrics["ddtree"]["4"]["tau_token_weighted"]
    assert ends["ddtree"]["4"] == pytest.approx((tau4 * 0.010 / 0.017, tau4 * 0.011 / 0.016))
    shown = dflash("results", "show", "run-a", "--results-dir", str(root))
    row = next(ln for ln in shown.stdout.splitlines() if "speedup estimate" in ln)
    assert f"{est['chain']:.2f}x ({ends['chain'][0]:.2f}-{ends['chain'][1]:.2f})" in row


def test_trials_too_far_apart_withhold_the_estimate_with_one_line(tmp_path):
    spread = {"target_step_s": [0.010, 0.031], "drafter_round_s": [0.003, 0.003]}
    root, run = with_costs(tmp_path, spread)
    assert speedup.estimate(run) == {"withheld": speedup.withheld(run)}
    assert "target_step_s took 10.0-31.0 ms (3.1x apart" in speedup.withheld(run)
    assert summary.summary(run)["speedup_estimate"] is None
    trade = speedup.tradeoff(run)
    assert trade["estimate_withheld"] == speedup.withheld(run)
    assert trade["chain"]["speedup_estimate"] is None and trade["target_step_s"] == 0.010
    shown = dflash("results", "show", "run-a", "--results-dir", str(root))
    row = next(ln for ln in shown.stdout.splitlines() if "speedup estimate" in ln)
    assert "withheld: the host's trials of target_step_s" in row


def test_sub_millisecond_trials_far_apart_in_ratio_still_give_an_estimate(tmp_path):
    """A tiny model's parts take well under a millisecond: 2x apart there is the clock and
    the scheduler, not a busy host (CI's idle box withheld a tiny eval's estimate)."""
    spread = {"target_step_s": [0.0004, 0.0009], "drafter_round_s": [0.0002, 0.0002]}
    _, run = with_costs(tmp_path, spread)
    assert speedup.withheld(run) is None
    assert summary.summary(run)["speedup_estimate"] > 0


def test_parts_timed_once_are_named_and_a_malformed_spread_is_ignored(tmp_path):
    """A 27B's trial can cost seconds: the host times such a part once (`round_timing`),
    its spread one number, and the line says so; a host's spread of another shape (none,
    or not positive) gives no range rather than a crash."""
    spread = {
        "target_step_s": [0.010],
        "target_verify_s/4": [0.012, 0.014],
        "drafter_round_s": [],
        "target_verify_s/3": [0.011, -1.0],
    }
    root, run = with_costs(tmp_path, spread)
    tau = run.metrics["tau_token_weighted"]
    assert speedup.timed_once(run) == ["target_step_s"]
    assert set(speedup.spans(run)) == {"target_step_s", "target_verify_s/4"}
    ends = speedup.estimate_range(run)
    assert ends["chain"] == pytest.approx((tau * 0.010 / 0.017, tau * 0.010 / 0.015))
    shown = dflash("results", "show", "run-a", "--results-dir", str(root))
    row = next(ln for ln in shown.stdout.splitlines() if "speedup estimate" in ln)
    assert "timed once, no spread: target_step_s" in row
