"""A sharded eval above temperature 0 over THREE real loopback sshd hosts whose inventory
eval role sets the sampling (no flag given): a ground-truth file of sampled completions
(``--ground-truth-kind file``) is taken as made at that temperature (ground_truth.json
and the result say so), each shard computes the expectation at it, and the merged result's
``expected`` and expected tau are those of every sample, equal to one host's run with
the same sampling given as flags; the two runs pair completion by completion."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.eval import run as remote_eval
from orchestrator.eval.shards import run as shard
from orchestrator.inventory import load_inventory
from orchestrator.results import compare as cmp
from orchestrator.results import store as res
from remote.protocol import EvalSpec
from tests.helpers.slurm import sampled_ground_truth
from tests.helpers.sshd import ssh_host_entry, sshd_hosts

HOSTS = ("ta", "tb", "tc")


@pytest.fixture(scope="module")
def three_sshd(ssh_base, user_key):
    with sshd_hosts(ssh_base, "sampled", HOSTS) as servers:
        yield servers


def test_a_sharded_eval_at_the_inventorys_temperature_merges_the_expectation(
    three_sshd, ssh_base, make_inventory, eval_role, tmp_path
):
    role = eval_role(temperature=0.7, draft_policy="sample", top_k=40)
    inv_path = make_inventory(
        hosts={n: ssh_host_entry(s, ssh_base, roles={"eval": role}) for n, s in three_sshd.items()},
        groups={"evals": list(HOSTS)},
        defaults={"eval_host": "ta", "results_dir": str(tmp_path / "results")},
    )
    inv = load_inventory(inv_path)
    gt = three_sshd["ta"].root / "sampled-gt.jsonl"
    sampled_ground_truth(gt)
    options = remote_eval.EvalOptions(
        ground_truth=str(gt), ground_truth_kind="file", engine=EvalSpec(budgets=())
    )
    merged = shard.run_sharded(inv, list(HOSTS), "step-12", options)
    result = json.loads((merged / "result.json").read_text())
    records = [json.loads(x) for x in (merged / "samples.jsonl").read_text().splitlines()]
    assert len({j["host"] for j in result["shards"]["jobs"]}) == 3  # every host had a shard
    assert json.loads((merged / "spec.json").read_text())["sampling"]["temperature"] == 0.7
    made = json.loads((merged / "ground_truth.json").read_text())
    assert made["sampling"]["temperature"] == 0.7 and made["sampling"]["top_k"] == 40
    exp = result["expected"]
    assert (exp["temperature"], exp["top_k"], exp["draft_policy"]) == (0.7, 40, "sample")
    taus = [r["expected"]["tau"] for r in records]
    assert exp["samples"] == len(records) == 6  # every shard's samples, not the first's
    assert exp["tau"] == pytest.approx(sum(taus) / 6)
    assert result["metrics"]["expected_tau"] == pytest.approx(exp["tau"])
    assert [r["prompt_id"] for r in records] == ["q0", "q0", "q1", "q1", "q2", "q2"]

    # one host, the sampling given as flags (--ground-truth-kind file --temperature 0.7
    # --top-k 40 --draft-policy sample) rather than by the role: the same expectation
    flags = EvalSpec(budgets=(), draft_policy="sample")
    given = replace(options, temperature=0.7, top_k=40, engine=flags, chosen=None)
    single = remote_eval.run_eval(inv, "ta", "step-12", given)
    assert json.loads((single / "ground_truth.json").read_text())["sampling"]["temperature"] == 0.7
    one = json.loads((single / "result.json").read_text())
    assert one["expected"]["tau"] == pytest.approx(exp["tau"])
    assert one["expected"]["per_position"] == pytest.approx(exp["per_position"])
    assert result["inputs"]["ground_truth_sha256"] == one["inputs"]["ground_truth_sha256"]
    same = cmp.paired(res.load_run(single), res.load_run(merged))
    assert same.comparable and same.pairing == "completions"
    assert cmp.headline(same.deltas).metric == "expected_tau"
