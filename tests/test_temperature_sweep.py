"""`dflash remote-eval --temperature 0,0.8` over the loopback eval host: one complete run
per temperature (each over its own ground truth, made on the host by the tiny target),
the sweep's table equal to each run's tau, the target's features computed once per
ground truth (the feature cache's counters), and `results list`/`show` finding the sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry

COMMON = ("--checkpoint", "step-12", "--samples", "2", "--max-new-tokens", "8")


@pytest.fixture
def inventory(eval_sshd, ssh_base, make_inventory, eval_role, tmp_path) -> Path:
    role = eval_role(ground_truth_kind="local")
    del role["ground_truth"]  # the target samples it on the host, at each temperature
    return make_inventory(
        # a workdir of its own: its feature cache holds no other test's ground truth
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd, ssh_base, roles={"eval": role}, workdir=str(tmp_path / "work")
            )
        },
        defaults={"eval_host": "evalhost", "results_dir": str(tmp_path / "results")},
    )


def features(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())["inputs"]["target_features"]


@pytest.mark.slow
def test_a_sweep_is_one_run_per_temperature_and_a_table_of_their_tau(inventory, tmp_path):
    got = dflash(
        "remote-eval", *COMMON, "--temperature", "0,0.8", "-i", str(inventory), "--json",
        timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    sweep = json.loads(got.stdout)
    assert [r["temperature"] for r in sweep["runs"]] == [0.0, 0.8]
    root = tmp_path / "results"
    assert (root / sweep["sweep_id"] / "sweep.json").is_file()
    assert (root / sweep["sweep_id"] / "tau_by_temperature.png").is_file()
    for row in sweep["runs"]:
        run_dir = root / row["run_id"]
        result = json.loads((run_dir / "result.json").read_text())
        spec = json.loads((run_dir / "spec.json").read_text())
        assert spec["sampling"]["temperature"] == row["temperature"]
        # above 0 the expectation (the walk's rounds are one draw), at 0 the walk
        want = result["expected"] if row["temperature"] else result["metrics"]
        assert ("expected" in result) == (row["temperature"] > 0)
        assert row["tau"] == want["tau" if row["temperature"] else "tau_per_sample_mean"]
        assert row["tau_token_weighted"] == want["tau_token_weighted"]
        lo, hi = row["tau_interval"]
        assert lo <= row["tau"] <= hi
        # its own ground truth: computed by the target once, kept for the next eval of it
        feats = features(run_dir)
        assert feats["cached"] is False and feats["samples_stored"] == 2
    hot = dflash(
        "remote-eval", *COMMON, "--temperature", "0.8", "-i", str(inventory), "--json",
        timeout=300,
    )  # fmt: skip
    assert hot.returncode == 0, hot.stderr
    again = Path(json.loads(hot.stdout)["run_dir"])
    assert features(again)["cached"] is True and features(again)["samples_cached"] == 2
    hot_tau = json.loads((again / "result.json").read_text())["expected"]["tau"]
    assert hot_tau == pytest.approx(sweep["runs"][1]["tau"])

    listed = json.loads(dflash("results", "list", "-i", str(inventory), "--json").stdout)
    assert [s["sweep_id"] for s in listed if s.get("kind") == "sweep"] == [sweep["sweep_id"]]
    shown = dflash("results", "show", sweep["sweep_id"], "-i", str(inventory))
    assert shown.returncode == 0, shown.stderr
    assert "tau by temperature" in shown.stdout
    assert all(r["run_id"] in shown.stdout for r in sweep["runs"])


@pytest.mark.slow
def test_a_sweep_refuses_a_file_ground_truth_and_a_bad_temperature(inventory, tmp_path):
    gt = tmp_path / "gt.jsonl"
    gt.write_text('{"id": "a", "prompt_ids": [1, 2], "completion_ids": [3]}\n')
    for args, want in (
        (
            ("--temperature", "0,1", "--ground-truth", str(gt), "--ground-truth-kind", "file"),
            "a temperature sweep samples",
        ),
        (("--temperature", "0,hot"), "temperature 'hot' is not a number"),
        (("--temperature", "0,1", "--detach"), "drop --detach"),
    ):
        got = dflash("remote-eval", *COMMON, *args, "-i", str(inventory))
        assert got.returncode != 0
        assert want in one_error_line(got), args
    assert not (tmp_path / "results").exists()  # nothing started, nothing written


def test_the_table_takes_the_walk_at_0_and_the_expectation_above(tmp_path):
    """Rows in temperature order, each from its own run: at 0 the walk's tau, above 0
    the ``expected`` block's (not the walk's one draw); a damaged sweep.json is one line."""
    from orchestrator.errors import DflashError
    from orchestrator.results import store as res
    from orchestrator.results import sweep as view
    from tests.helpers.runs import edit_result, make_run

    greedy = make_run(tmp_path, "r-greedy", "step-9", 9, skill=0.8)
    hot = make_run(tmp_path, "r-hot", "step-9", 9, skill=0.8)
    spec = json.loads((hot / "spec.json").read_text())
    (hot / "spec.json").write_text(json.dumps({**spec, "sampling": {"temperature": 0.8}}))
    recs = [json.loads(line) for line in (hot / "samples.jsonl").read_text().splitlines()]
    for i, r in enumerate(recs):
        r["expected"] = {"tau": 1.5 + i / 10}
    (hot / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    edit_result(hot, lambda d: d.update(expected={"tau": 1.65, "tau_token_weighted": 1.6}))
    sweep = view.write_sweep([res.load_run(hot), res.load_run(greedy)], tmp_path, "sweep-a")
    cold, warm = sweep.rows
    walk = res.load_run(greedy).metrics
    assert (cold["run_id"], cold["temperature"], cold["tau"]) == (
        "r-greedy",
        0.0,
        walk["tau_per_sample_mean"],
    )
    assert cold["tau_token_weighted"] == walk["tau_token_weighted"] != 1.6
    assert (warm["run_id"], warm["temperature"], warm["tau"]) == ("r-hot", 0.8, 1.65)
    assert warm["tau_token_weighted"] == 1.6 and warm["sampling"].startswith("temperature 0.8")
    assert 1.5 <= warm["tau_interval"][0] <= 1.65 <= warm["tau_interval"][1] <= 1.8
    assert view.load(tmp_path / "sweep-a").rows == sweep.rows
    from orchestrator.results import catalog

    page = catalog.report(None, tmp_path / "report.html", "t", tmp_path, None).path.read_text()
    assert "temperature sweeps" in page and 'data-plot="sweep-a"' in page
    assert "r-hot" in page.split("temperature sweeps")[1]
    # `results show` takes a sweep as it takes a run: by id, unique prefix or part
    assert catalog.find("sweep-", tmp_path, None).sweep_id == "sweep-a"
    assert catalog.find("r-h", tmp_path, None).run_id == "r-hot"
    with pytest.raises(DflashError, match="matches 2 runs"):
        catalog.find("r-", tmp_path, None)
    (tmp_path / "sweep-a" / "sweep.json").write_text('{"schema": "dflash.sweep/1"}')
    with pytest.raises(DflashError, match="is not a dflash sweep"):
        view.load(tmp_path / "sweep-a")


def test_each_temperature_takes_only_what_applies_to_it():
    """At 0 a sweep's run drops top-k, top-p, --gt-samples and --draft-policy (greedy
    takes none); above 0 it keeps them."""
    from orchestrator.eval.spec import EvalOptions, engine_spec
    from orchestrator.eval.sweep import at, first_sampled, temperatures

    temps = temperatures("0, 0.6,1")
    assert temps == (0.0, 0.6, 1.0) and first_sampled(temps) == 0.6
    engine, chosen = engine_spec(draft_policy="sample")
    base = EvalOptions(temperature=0.6, top_p=0.9, gt_samples=2, engine=engine, chosen=chosen)
    greedy, hot = at(base, 0.0), at(base, 1.0)
    assert (greedy.top_p, greedy.gt_samples, greedy.engine.draft_policy) == (None, None, "argmax")
    assert (hot.temperature, hot.top_p, hot.gt_samples, hot.engine.draft_policy) == (
        1.0,
        0.9,
        2,
        "sample",
    )
