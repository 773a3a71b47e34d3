"""tau by category and by completion length in every result view (show, JSON, CSV, the
HTML report), the paired delta per category in `results compare`, and its refusal of runs
whose thinking mode or chat template differ."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from orchestrator.results import breakdown, compare, summary
from orchestrator.results import store as res
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.runs import make_run

CATS = ("qa", "rag", "math_reasoning")


@pytest.fixture
def runs(tmp_path) -> Path:
    """Two checkpoints of one training run over the same 9 labelled samples."""
    root = tmp_path / "results"
    make_run(root, "run-a", "step-0", 0, skill=0.2, samples=9, categories=CATS, created=1e9)
    make_run(root, "run-b", "step-300", 300, skill=0.7, samples=9, categories=CATS, created=2e9)
    return root


def _tau(recs: list[dict]) -> float:
    return sum(r["tau"] for r in recs) / len(recs)


def test_each_group_is_summed_as_the_run_is():
    recs = [
        {"id": "a", "category": "qa", "completion_tokens": 64, "rounds": [2, 2], "tau": 2.0},
        {"id": "b", "category": "mt_bench", "subcategory": "coding", "completion_tokens": 65},
        {"id": "c", "category": "qa", "completion_tokens": 1025, "rounds": [4, 4, 1], "tau": 3.0},
        {"id": "d", "completion_tokens": 300, "rounds": [3], "tau": 3.0},
    ]
    recs[1].update(rounds=[1, 3], tau=2.0, ddtree={"8": [4]})
    out = breakdown.breakdown(recs)
    assert [(g["name"], g["samples"]) for g in out["category"]] == [
        ("qa", 2),
        ("mt_bench", 1),
        ("(none)", 1),
    ]
    qa = out["category"][0]
    got = (qa["tau_per_sample_mean"], qa["tau_token_weighted"], qa["rounds"], qa["tokens"])
    assert got == (2.5, 13 / 5, 5, 13)
    assert [g["name"] for g in out["subcategory"]] == ["mt_bench/coding"]
    assert out["category"][1]["ddtree"] == {"8": 4.0}
    assert [g["name"] for g in out["completion_length"]] == ["1-64", "65-128", "257-512", "1025+"]
    assert breakdown.length_bucket(1024) == "513-1024" and breakdown.length_bucket(1) == "1-64"
    unlabelled = breakdown.breakdown(
        [{k: v for k, v in r.items() if "category" not in k} for r in recs]
    )
    assert list(unlabelled) == ["completion_length"]


def test_show_json_csv_and_report_carry_tau_per_category(runs, tmp_path):
    run = res.load_run(runs / "run-b")
    recs = res.records(run)
    want = {c: _tau([r for r in recs if r["category"] == c]) for c in CATS}
    got = {g["name"]: g["tau_per_sample_mean"] for g in breakdown.of_run(run)["category"]}
    assert got == pytest.approx(want) and len(set(want.values())) > 1

    shown = dflash("results", "show", "run-b", "--results-dir", str(runs))
    assert shown.returncode == 0, shown.stderr
    assert "tau by category" in shown.stdout
    # One length bucket holds every sample: the run's own line again, left out of tables.
    assert "tau by completion length" not in shown.stdout
    for c in CATS:
        row = next(ln for ln in shown.stdout.splitlines() if f" {c} " in f" {ln} ")
        assert f"{want[c]:.3f}" in row, row
    doc = json.loads(
        dflash("results", "show", "run-b", "--results-dir", str(runs), "--json").stdout
    )
    got = {g["name"]: g["tau_per_sample_mean"] for g in doc["breakdown"]["category"]}
    assert got == pytest.approx(want)
    assert doc["metrics"] == run.result["metrics"]  # the document itself, plus the breakdown

    exported = dflash("results", "export", "-f", "csv", "--results-dir", str(runs))
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(exported.stdout))}
    for c in CATS:
        assert float(rows["run-b"][f"tau_per_sample_mean_category_{c}"]) == pytest.approx(want[c])
        assert rows["run-b"][f"samples_category_{c}"] == "3"
    assert rows["run-b"]["samples_completion_length_1-64"] == "9"

    page = tmp_path / "r.html"
    assert dflash("results", "report", "-o", str(page), "--results-dir", str(runs)).returncode == 0
    html = page.read_text()
    assert html.count("<h3>tau by category</h3>") == 2  # both runs
    section = html.split("<summary>step-300")[1].split("environment and provenance")[0]
    assert "Δ tau vs baseline" in section
    for c in CATS:  # each category's row: its tau, then its paired delta and interval
        cells = re.search(rf'<td class="l">{c}</td>(.*?)</tr>', section).group(1)
        assert f"{want[c]:.3f}" in cells and re.search(r"\[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", cells)


def test_compare_gives_a_paired_delta_and_interval_per_category(runs):
    a, b = res.load_run(runs / "run-a"), res.load_run(runs / "run-b")
    p = compare.paired(a, b)
    assert p.comparable
    groups = {(g.axis, g.name): g for g in p.groups}
    assert set(groups) == {("category", c) for c in CATS} | {
        ("completion_length", "1-64"),
        ("context", "0"),  # every round of these short samples starts before position 512
    }
    ra, rb = res.records(a), res.records(b)
    for c in CATS:
        g = groups[("category", c)]
        diffs = [y["tau"] - x["tau"] for x, y in zip(ra, rb, strict=True) if x["category"] == c]
        tau = next(d for d in g.deltas if d.metric == "tau_per_sample_mean" and d.budget is None)
        assert g.samples == 3 and tau.delta == pytest.approx(sum(diffs) / 3)
        assert tau.low <= tau.delta <= tau.high
        assert {(d.metric, d.budget) for d in g.deltas} == {
            ("tau_per_sample_mean", b) for b in (None, "2", "4")
        }
        assert {d.label for d in g.deltas} == {"tau", "DDTree-2 tau", "DDTree-4 tau"}
    whole = groups[("completion_length", "1-64")].deltas
    assert [(d.delta, d.low, d.high) for d in whole] == [(d.delta, d.low, d.high) for d in p.deltas]

    proc = dflash("results", "compare", "run-a", "run-b", "--results-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    assert "B vs A, tau by category: paired tau delta" in proc.stdout
    assert "tau by completion length" not in proc.stdout  # one bucket: the run's line
    for c in CATS:
        d = compare.headline(groups[("category", c)].deltas)
        row = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(c + " "))
        assert f"{d.delta:+.3f}" in row and f"[{d.low:+.3f}, {d.high:+.3f}]" in row, row
    doc = json.loads(
        dflash("results", "compare", "run-a", "run-b", "--results-dir", str(runs), "--json").stdout
    )
    assert {g["name"] for g in doc["paired"][0]["groups"] if g["axis"] == "category"} == set(CATS)


@pytest.mark.parametrize(
    "a_kw, b_kw, line",
    [
        ({"thinking": False}, {"thinking": True}, "different thinking mode: off vs on"),
        ({"chat_template": "1" * 64}, {"chat_template": "2" * 64}, "different chat template"),
    ],
)
def test_compare_refuses_runs_prompted_differently(tmp_path, a_kw, b_kw, line):
    root = tmp_path / "results"
    make_run(root, "run-a", "step-0", 0, **a_kw)
    make_run(root, "run-b", "step-300", 300, **b_kw)
    proc = dflash("results", "compare", "run-a", "run-b", "--results-dir", str(root))
    assert proc.returncode == 2  # a user error: one line, as every DflashError
    err = one_error_line(proc)
    assert err.startswith(f"error: run-b vs run-a: {line}") and "--allow-different-prompting" in err
    allowed = dflash(
        "results", "compare", "run-a", "run-b", "--allow-different-prompting",
        "--results-dir", str(root), "--json",
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    paired = json.loads(allowed.stdout)["paired"][0]
    assert paired["comparable"] is True and paired["deltas"]
    # The report never exits: it says why there is no delta.
    a, b = res.load_run(root / "run-a"), res.load_run(root / "run-b")
    assert compare.paired(a, b).problems[0].startswith(line)
    # Runs that recorded neither (older results) are paired as before.
    make_run(root, "run-c", "step-600", 600)
    assert compare.prompting_problems(a, res.load_run(root / "run-c")) == []


def test_a_runs_plots_and_its_report_draw_tau_per_category(runs, tmp_path):
    from orchestrator.results import plots
    from tests.helpers.images import png_size

    run = res.load_run(runs / "run-b")
    drawn = plots.plot_run(run)
    assert run.path / "tau_by_category.png" in drawn
    w, h = png_size(run.path / "tau_by_category.png")
    assert w >= 300 and h >= 150
    svg = plots.svg(plots.breakdown_figure(run), "t")
    assert sorted(re.findall(r'id="data-category-(\d+)"', svg)) == ["0", "1", "2"]
    # An axis of one group is the run's line again: no figure for it.
    make_run(runs, "run-c", "step-600", 600, samples=4)
    assert plots.breakdown_figure(res.load_run(runs / "run-c")) is None
    page = tmp_path / "r.html"
    made = dflash(
        "results", "report", "run-a", "run-b", "-o", str(page), "--results-dir", str(runs)
    )
    assert made.returncode == 0, made.stderr
    assert page.read_text().count('data-plot="cat') == 2


def test_the_speedup_estimate_is_the_stated_formula_over_the_hosts_round_costs(runs):
    from orchestrator.results import speedup
    from tests.helpers.runs import edit_result

    costs = {
        "context_tokens": 30,
        "target_step_s": 0.010,
        "target_verify_s": {"4": 0.012, "3": 0.011, "5": 0.013},
        "drafter_round_s": 0.003,
    }
    edit_result(runs / "run-b", lambda d: d["timings"].update(round_costs=costs))
    edit_result(runs / "run-b", lambda d: d["inputs"].update(block_size=4))
    run = res.load_run(runs / "run-b")
    m = run.metrics
    est = speedup.estimate(run)
    assert est["chain"] == pytest.approx(m["tau_token_weighted"] * 0.010 / (0.012 + 0.003))
    dd = m["ddtree"]
    assert est["ddtree"] == pytest.approx(
        {
            "2": dd["2"]["tau_token_weighted"] * 0.010 / (0.011 + 0.003),
            "4": dd["4"]["tau_token_weighted"] * 0.010 / (0.013 + 0.003),
        }
    )
    assert summary.summary(run)["speedup_estimate"] == est["chain"]
    shown = dflash("results", "show", "run-b", "--results-dir", str(runs))
    row = next(ln for ln in shown.stdout.splitlines() if "speedup estimate" in ln)
    assert f"{est['chain']:.2f}x" in row and f"DDTree-4 {est['ddtree']['4']:.2f}x" in row
    exported = dflash("results", "export", "-f", "csv", "--results-dir", str(runs))
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(exported.stdout))}
    assert float(rows["run-b"]["speedup_estimate"]) == pytest.approx(est["chain"])
    assert rows["run-a"]["speedup_estimate"] == ""  # no costs recorded: no estimate
    # The costs behind the estimates are columns too, in seconds.
    b = rows["run-b"]
    assert [float(b[k]) for k in ("target_step_s", "drafter_round_s", "verify_s_chain")] == [
        0.010,
        0.003,
        0.012,
    ]
    assert (float(b["verify_s_ddtree_2"]), b["verify_mask_ddtree_2"]) == (0.011, "causal")
    assert rows["run-a"]["verify_s_chain"] == ""
    # A host that could not measure says why; no estimate, the run stands.
    edit_result(runs / "run-b", lambda d: d["timings"].update(round_costs={"error": "x: y"}))
    assert speedup.estimate(res.load_run(runs / "run-b")) == {}
    # A host's costs are checked as every field is.
    edit_result(runs / "run-b", lambda d: d["timings"].update(round_costs={"target_step_s": "1"}))
    with pytest.raises(res.BadRun, match="timings.round_costs.target_step_s"):
        res.load_run(runs / "run-b")


def test_ddtrees_budget_trade_off_is_in_json_table_plot_and_report(runs, tmp_path):
    from orchestrator.results import plots, speedup
    from tests.helpers.images import png_size
    from tests.helpers.runs import edit_result

    costs = {
        "context_tokens": 30,
        "target_step_s": 0.010,
        "target_verify_s": {"4": 0.012, "3": 0.011, "5": 0.013},
        "tree_verify_s": {"2": 0.0115},  # DDTree-4's tree mask not timed: its causal 5
        "drafter_round_s": 0.003,
    }
    edit_result(runs / "run-b", lambda d: d["timings"].update(round_costs=costs))
    edit_result(runs / "run-b", lambda d: d["inputs"].update(block_size=4))
    run = res.load_run(runs / "run-b")
    dd, m = run.metrics["ddtree"], run.metrics
    trade = speedup.tradeoff(run)
    assert trade["formula"] == "speedup = tau_token_weighted * t_step / (t_verify + t_draft)"
    assert [
        (r["budget"], r["tokens_verified"], r["verify_s"], r["verify_mask"])
        for r in trade["budgets"]
    ] == [(2, 3, 0.0115, "tree"), (4, 5, 0.013, "causal")]
    two, four = trade["budgets"]
    assert two["tau_per_sample_mean"] == dd["2"]["tau_per_sample_mean"]
    assert two["speedup_estimate"] == pytest.approx(
        dd["2"]["tau_token_weighted"] * 0.010 / (0.0115 + 0.003)
    )
    assert speedup.estimate(run)["ddtree"] == {
        "2": two["speedup_estimate"],
        "4": four["speedup_estimate"],
    }
    chain = trade["chain"]
    assert (chain["draft_tokens"], chain["verify_s"]) == (3, 0.012)
    assert chain["speedup_estimate"] == pytest.approx(m["tau_token_weighted"] * 0.010 / 0.015)
    # One row projection feeds the terminal and the HTML table.
    rows = speedup.tradeoff_rows(trade)
    assert [len(r) for r in rows] == [len(speedup.TRADEOFF_COLUMNS)] * 3  # 2 budgets, chain
    taus = (two["tau_per_sample_mean"], two["tau_token_weighted"])
    assert rows[0][:5] == (2, dd["2"].get("topk"), *taus, dd["2"]["rounds"])
    assert rows[-1][0] == "chain (3 drafts)"
    assert (rows[-1][4], rows[-1][6]) == (m["rounds"], "causal")

    shown = dflash("results", "show", "run-b", "--json", "--results-dir", str(runs))
    assert json.loads(shown.stdout)["ddtree_tradeoff"] == json.loads(json.dumps(trade))
    table = dflash("results", "show", "run-b", "--results-dir", str(runs), env={"COLUMNS": "60"})
    table = table.stdout
    assert "DDTree budgets: tau and speedup estimate" in table
    trade_table = table.split("DDTree budgets")[1].split("acceptance histogram")[0]
    row = next(ln.split() for ln in trade_table.splitlines() if ln.split()[:1] == ["2"])
    assert "11.500" in row and row[-1] == f"{two['speedup_estimate']:.2f}x"  # at 60 too
    assert all(len(ln) <= 60 for ln in trade_table.splitlines()), trade_table
    assert "chain (3 drafts)" in table and f"{chain['speedup_estimate']:.2f}x" in table

    drawn = plots.plot_run(run)
    assert run.path / "ddtree_tradeoff.png" in drawn
    assert png_size(run.path / "ddtree_tradeoff.png")[0] >= 300
    svg = plots.svg(plots.tradeoff_figure(run), "t")
    for gid in ("tradeoff-tau", "tradeoff-speedup", "chain-tau", "chain-speedup"):
        assert f'id="data-{gid}' in svg, gid
    page = tmp_path / "r.html"
    made = dflash("results", "report", "run-b", "-o", str(page), "--results-dir", str(runs))
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    assert 'data-plot="trade' in html and "speedup est." in html and "chain (3 drafts)" in html

    # Without round costs: tau per budget still, no estimate, no speedup line.
    bare = res.load_run(runs / "run-a")
    assert [r["speedup_estimate"] for r in speedup.tradeoff(bare)["budgets"]] == [None, None]
    svg = plots.svg(plots.tradeoff_figure(bare), "u")
    assert 'id="data-tradeoff-tau' in svg and "data-tradeoff-speedup" not in svg
