"""Sharded remote eval over THREE real loopback sshd eval hosts: the merged result equals the
single-host result sample for sample (aggregates too), ground truth is fetched once, and a
host whose job is killed mid-run has its unfinished samples re-run on the others."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.eval import run as remote_eval
from orchestrator.eval.shards import plan as shard_plan
from orchestrator.eval.shards import run as shard
from orchestrator.inventory import load_inventory
from remote.eval.metrics import summarize
from remote.protocol import EvalSpec
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry, sshd_hosts

HOSTS = ("sa", "sb", "sc")


# ---- plan (pure) ------------------------------------------------------------------------


def _rec(i: int, prompt: int, completion: int | None) -> dict:
    r = {"id": f"s{i}", "prompt_ids": [1] * prompt}
    if completion is not None:
        r["completion_ids"] = [2] * completion
    return r


def test_plan_balances_expected_tokens_not_sample_count():
    # One long sample and six short ones: by count 2 hosts would get 4 and 3 samples; by
    # tokens the long one stands alone.
    recs = [_rec(0, 10, 10), _rec(1, 10, 300), *[_rec(i, 10, 20) for i in range(2, 8)]]
    plan = shard_plan.plan_shards(recs, ["a", "b"])
    assert [s.indices for s in plan] == [[1], [0, 2, 3, 4, 5, 6, 7]]
    assert [s.tokens for s in plan] == [310, 200]
    # Unknown completion: prompt + max_new_tokens.
    recs = [_rec(0, 5, None), _rec(1, 5, 50), _rec(2, 5, 50)]
    plan = shard_plan.plan_shards(recs, ["a", "b"], max_new_tokens=100)
    assert [s.indices for s in plan] == [[0], [1, 2]] and plan[0].tokens == 105
    # Every index exactly once, each shard in ascending order; a subset when asked.
    recs = [_rec(i, 3 + i % 5, 7 * i % 11 + 1) for i in range(23)]
    plan = shard_plan.plan_shards(recs, ["a", "b", "c"], indices=list(range(5, 23)))
    got = sorted(i for s in plan for i in s.indices)
    assert got == list(range(5, 23))
    assert all(s.indices == sorted(s.indices) for s in plan)
    biggest = max(shard_plan.expected_tokens(r, 0) for r in recs)
    assert max(s.tokens for s in plan) - min(s.tokens for s in plan) <= biggest
    with pytest.raises(DflashError):
        shard_plan.plan_shards(recs, [])


def test_merged_metrics_of_sharded_records_equal_the_summary_of_the_whole():
    """`merge_result` recomputes the metrics from the records the shards sent back: planned
    across three hosts and gathered in ground-truth order, they give the numbers of one
    summary of every sample, which match counts made by hand; a lost shard changes them."""
    rng = random.Random(3)
    B = 4
    recs = []
    for i in range(7):
        rounds = [rng.randint(1, B) for _ in range(rng.randint(1, 9))]
        recs.append(
            {
                **_rec(i, rng.randint(2, 30), sum(rounds)),
                "rounds": rounds,
                "prompt_tokens": 5,
                "completion_tokens": sum(rounds),
                "seconds": {"target": 0.5, "drafter": 0.25, "ddtree": 0.125},
                "position_attempts": [rng.randint(0, 9) for _ in range(B - 1)],
                "position_hits": [rng.randint(0, 3) for _ in range(B - 1)],
                "agreement": {"match": rng.randint(0, 5), "total": 5},
                "ddtree": {"8": [rng.randint(1, B) for _ in range(3)]},
            }
        )
    whole = summarize(recs, B, [8], None, 320)
    plan = shard_plan.plan_shards(recs, list(HOSTS))
    assert all(s.indices for s in plan)
    assert sorted(i for s in plan for i in s.indices) == list(range(len(recs)))
    returned = {i: recs[i] for s in reversed(plan) for i in s.indices}  # any arrival order
    inputs = {"block_size": B, "target_vocab_size": 320, "ddtree": {"budgets": [8]}}
    results = [{"inputs": dict(inputs), "timings": {}} for _ in plan]

    def merged(records: list[dict]) -> dict:
        return shard_plan.merge_result(
            results, records, ground_truth_source={}, shards={}, job={}, wall_s=1.0
        )["metrics"]

    metrics = merged([returned[i] for i in sorted(returned)])
    assert metrics == whole
    rounds = [n for r in recs for n in r["rounds"]]
    assert metrics["samples"] == 7 and metrics["ddtree"]["8"]["topk"] == 8
    assert metrics["tau_token_weighted"] == sum(rounds) / len(rounds)
    assert metrics["acceptance_histogram"] == {str(k): rounds.count(k) for k in range(1, B + 1)}
    assert metrics["target_agreement"]["match"] == sum(r["agreement"]["match"] for r in recs)
    assert [p["attempts"] for p in metrics["per_position_acceptance"]] == [
        sum(r["position_attempts"][j] for r in recs) for j in range(B - 1)
    ]
    lost = merged([returned[i] for i in sorted(returned) if i not in plan[0].indices])
    assert lost != whole and lost["samples"] == 7 - len(plan[0].indices)


def test_a_sampled_runs_merged_expectation_is_every_shards_samples():
    """At T > 0 the merged ``expected`` is summed over every shard's records (seeded: with
    the token-weighted tau's standard error), not copied from the first shard's result."""
    from remote.eval.metrics import expected

    rng = random.Random(5)
    recs = []
    for i in range(6):
        rounds = [rng.randint(1, 4) for _ in range(rng.randint(2, 9))]
        drawn = {"tokens": sum(rounds), "rounds": len(rounds), "tau": sum(rounds) / len(rounds)}
        drawn |= {"histogram": {"1": 1.0}, "position_attempts": [2.0, 1.0, 0.0]}
        drawn |= {"position_hits": [rng.random(), 0.5, 0.0]}
        recs.append({**_rec(i, 10, sum(rounds)), "rounds": rounds, "expected": drawn})
        recs[-1] |= {"prompt_tokens": 5, "completion_tokens": sum(rounds), "ddtree": {}}
        recs[-1] |= {"seconds": {"target": 0.5, "drafter": 0.25, "ddtree": 0.125}}
        recs[-1] |= {"position_attempts": [1, 0, 0], "position_hits": [0, 0, 0]}
        recs[-1] |= {"agreement": {"match": 1, "total": 5}}
    sampling = {"temperature": 1.0, "top_k": None, "top_p": None, "draft_policy": "sample"}
    first = expected(recs[:3], {**sampling, "seed": 7}, "seeded")
    inputs = {"block_size": 4, "target_vocab_size": 320, "ddtree": {"budgets": []}}
    results = [{"inputs": dict(inputs), "timings": {}, "expected": first} for _ in range(2)]
    result = shard_plan.merge_result(
        results, recs, ground_truth_source={}, shards={}, job={}, wall_s=1.0
    )
    merged = result["expected"]
    assert result["metrics"]["expected_tau"] == pytest.approx(merged["tau"])
    assert merged == expected(recs, {**sampling, "seed": 7}, "seeded") and merged != first
    assert merged["samples"] == 6 and merged["seed"] == 7 and merged["exact"] is False
    tokens, rounds = (sum(r["expected"][k] for r in recs) for k in ("tokens", "rounds"))
    assert merged["tau_token_weighted"] == tokens / rounds
    assert merged["tau_token_weighted_se"] > 0


def test_hosts_refuses_detach_in_one_line(tmp_path, make_inventory):
    inv = make_inventory(hosts={"a": {"transport": "local"}, "b": {"transport": "local"}})
    out = dflash("remote-eval", "--hosts", "a,b", "--detach", "--checkpoint", "s", "-i", str(inv))
    assert out.returncode != 0
    assert "--hosts" in one_error_line(out) and "--detach" in one_error_line(out)


# ---- end to end -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_sshd(ssh_base, user_key):
    with sshd_hosts(ssh_base, "shard", HOSTS) as servers:
        yield servers


@pytest.fixture
def inventory_path(three_sshd, ssh_base, make_inventory, eval_role, tmp_path):
    hosts = {
        name: ssh_host_entry(srv, ssh_base, roles={"eval": eval_role()})
        for name, srv in three_sshd.items()
    }
    return make_inventory(
        hosts=hosts,
        groups={"evals": list(HOSTS)},
        defaults={"eval_host": "sa", "results_dir": str(tmp_path / "results")},
    )


def _without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _samples(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


def _result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def _assert_same_as_single(merged: Path, single: Path) -> None:
    a, b = _samples(merged), _samples(single)
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert _without_timings(a) == _without_timings(b)
    assert _result(merged)["metrics"] == _result(single)["metrics"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shard-prompts") / "varied.jsonl"
    texts = [
        "Hi.",
        "What is two plus two?",
        "Write a haiku about rain and the sea at night.",
        "def add(a, b):",
        "The quick brown fox jumps over the lazy dog, again and again.",
        "Name three colours.",
        "Explain recursion to a child in one sentence please.",
        "Count to five.",
    ]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


def test_three_hosts_merge_equals_one_host_and_ground_truth_is_fetched_once(
    inventory_path, server, prompts, three_sshd
):
    inv = load_inventory(inventory_path)
    options = remote_eval.EvalOptions(
        prompts=str(prompts), max_new_tokens=20, engine=EvalSpec(budgets=(4, 8))
    )
    cli = dflash(
        "remote-eval",
        "--hosts",
        "evals",
        "--checkpoint",
        "step-12",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "20",
        "--budgets",
        "4,8",
        "-i",
        str(inventory_path),
        timeout=600,
    )
    assert cli.returncode == 0, cli.stderr
    # One progress view: a row per host and a total, all complete.
    rows = {ln.split()[0]: ln for ln in cli.stderr.splitlines() if ln.strip()}
    assert {"sa", "sb", "sc", "total"} <= set(rows), cli.stderr
    assert "8/8" in rows["total"] and "tok/s" in rows["total"]
    assert "sharded across sa, sb, sc" in cli.stdout
    merged = Path(cli.stdout.split("results:")[-1].strip())
    # Ground truth: one request per prompt, made once for all three hosts.
    assert len(server.requests) == 8
    result = _result(merged)
    shards = result["shards"]
    assert shards["hosts"] == list(HOSTS) and result["reassigned"] == []
    assert shards["ground_truth"]["obtained_on"] == "sa"
    assert result["inputs"]["ground_truth_source"]["kind"] == "sglang"
    planned = sorted(i for p in shards["plan"] for i in p["samples"])
    assert planned == sorted(r["id"] for r in _samples(merged)) and len(planned) == 8
    assert all(p["samples"] for p in shards["plan"])  # all three hosts had work
    assert sorted(j["host"] for j in shards["jobs"]) == list(HOSTS)
    assert all(j["state"] == "done" for j in shards["jobs"])
    for name in HOSTS:  # each host evaluated what the plan gave it
        job = next(j for j in shards["jobs"] if j["host"] == name)
        planned_here = next(p["samples"] for p in shards["plan"] if p["host"] == name)
        assert job["samples"] == len(planned_here) == job["records_received"]
        assert f"{len(planned_here)}/{len(planned_here)}" in rows[name]
    for job in shards["jobs"]:
        assert (merged / job["run_dir"] / "result.json").is_file()
    # Each shard host was handed its slice of one file, not the server.
    for name, srv in three_sshd.items():
        spec = json.loads(
            (
                srv.root / "dflash" / "jobs" / f"{result['job']['job_id']}-{name}-1" / "spec.json"
            ).read_text()
        )
        assert spec["ground_truth"]["kind"] == "file"
    # The ground-truth-only job asked a server and loaded no model: its host checks had no
    # model to size (no torch import); each shard's checks did size its model.
    gt_job = three_sshd["sa"].root / "dflash" / "jobs" / shards["ground_truth"]["job_id"]
    assert json.loads((gt_job / "preflight.json").read_text())["ok"] is True
    assert "memory" not in json.loads((gt_job / "preflight.json").read_text())
    for job in shards["jobs"]:
        shard_dir = three_sshd[job["host"]].root / "dflash" / "jobs" / job["job_id"]
        assert json.loads((shard_dir / "preflight.json").read_text())["memory"]["target_bytes"]

    single = remote_eval.run_eval(inv, "sa", "step-12", options)
    assert len(server.requests) == 8  # the single run found sa's cache
    _assert_same_as_single(merged, single)
    assert _result(merged)["metrics"]["samples"] == 8


def _ground_truth_file(path: Path, lengths: list[int]) -> None:
    """Valid ground truth with chosen completion lengths (ids within the tiny vocab): long
    completions make each sample take long enough that a host can be killed mid-shard."""
    rng = random.Random(5)
    with open(path, "w") as fh:
        for i, n in enumerate(lengths):
            fh.write(
                json.dumps(
                    {
                        "id": f"g{i}",
                        "prompt_ids": [rng.randrange(8, 300) for _ in range(12)],
                        "completion_ids": [rng.randrange(8, 300) for _ in range(n)],
                    }
                )
                + "\n"
            )


def test_killed_host_has_its_unfinished_samples_rerun_elsewhere(inventory_path, three_sshd):
    inv = load_inventory(inventory_path)
    gt = three_sshd["sa"].root / "long-gt.jsonl"
    # Planned by tokens: g2 -> sa, g3 -> sb, g1 -> sc, then the short g0 -> sc (least
    # loaded). Killed after its first (short) sample, sc still has a long one to go: seconds
    # of work against the fraction of a second an event takes to reach us.
    _ground_truth_file(gt, [60, 2980, 3000, 3000])
    records = [json.loads(x) for x in gt.read_text().splitlines()]
    assert [s.indices for s in shard_plan.plan_shards(records, list(HOSTS))] == [[2], [3], [0, 1]]
    # positions="all" walks one sample at a time; the default walks a shard's samples in
    # lockstep, and they end together, leaving no sample between them for the kill to cut.
    options = remote_eval.EvalOptions(
        ground_truth=str(gt),
        ground_truth_kind="file",
        engine=EvalSpec(budgets=(4,), positions="all"),
    )
    victim = "sc"
    seen: dict = {"in_shard": False, "pid": None, "killed": False}

    def on_event(host: str, ev: dict) -> None:
        if host != victim or seen["killed"]:
            return
        if ev.get("event") == "shard":
            seen["in_shard"] = True
        elif ev.get("event") == "job" and seen["in_shard"]:
            seen["pid"] = ev["pgid"]  # the job's process group: supervisor and runner
        elif ev.get("event") == "sample" and seen["pid"]:
            os.killpg(seen["pid"], signal.SIGKILL)  # the job dies mid-run, no exit.json
            seen["killed"] = ev["done"]

    merged = shard.run_sharded(inv, list(HOSTS), "step-12", options, on_event=on_event)
    assert seen["killed"] == 1
    result = _result(merged)
    plan = {p["host"]: p["samples"] for p in result["shards"]["plan"]}
    [entry] = result["reassigned"]
    assert entry["host"] == victim and "lost" in entry["reason"]
    assert plan[victim] == ["g0", "g1"]
    assert entry["kept"] == ["g0"] and entry["samples"] == ["g1"]
    assert set(entry["to"]) <= {"sa", "sb"}
    assert sorted(s for ids in entry["to"].values() for s in ids) == sorted(entry["samples"])
    jobs = result["shards"]["jobs"]
    assert [j["state"] for j in jobs if j["host"] == victim] == ["failed"]
    assert len([j for j in jobs if j["state"] == "done"]) == 3  # two shards + the re-run

    single = remote_eval.run_eval(inv, "sa", "step-12", options)
    _assert_same_as_single(merged, single)
    assert result["metrics"]["samples"] == 4
