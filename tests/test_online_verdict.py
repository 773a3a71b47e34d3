"""The verdict without a server (`remote.online.verdict`, `remote.online.diagnosis`): the
engine's steps cut as the walk cuts its rounds, per-position counts, where two walks part,
each cause the diagnosis names, and known engine deviations (`remote.online.deviations`)
confirmed or ruled out against the rounds that differ."""

from __future__ import annotations

import re

from remote.online import verdict
from tests.helpers.screen import console_at


def test_vllms_uncut_last_step_is_cut_like_the_walk():
    # 8 tokens after the prefill's; the last step accepted 3 of which 1 fits
    assert verdict.cut_rounds([3, 0, 2, 3], 8) == ([4, 1, 3], 8)
    assert verdict.cut_rounds([3, 0, 2, 3], 10) == ([4, 1, 3, 2], 10)
    assert verdict.cut_rounds([0, 0], 5) == ([1, 1], 2)  # steps without a draft are missing


def test_position_acceptance_from_rounds():
    # k = 3: [4] all accepted; [1] refused at 1; [2] accepted 1, refused at 2; [1] cut by
    # the end (says nothing about position 1)
    pp = verdict.position_acceptance([[4, 1, 2, 1]], 3)
    assert [(p["attempts"], p["accepted"]) for p in pp] == [(3, 2), (2, 1), (1, 1)]


def test_first_divergence_names_round_and_token():
    assert verdict.first_divergence([2, 1, 3], [2, 1, 3]) is None
    assert verdict.first_divergence([2, 1, 3], [2, 2, 2]) == {
        "round": 1,
        "token": 3,
        "offline": 1,
        "online": 2,
    }


def _records(rounds: list[list[int]], k: int = 3, accepted=None, wrong: int | None = None):
    gt, off, on = [], [], []
    for i, r in enumerate(rounds):
        completion = list(range(10, 11 + sum(r)))
        gt.append({"id": f"s{i}", "prompt_ids": [1, 2], "completion_ids": completion})
        off.append({"id": f"s{i}", "rounds": r})
        ids = list(completion)
        if wrong is not None and i == 0:
            ids[wrong] = 999
        acc = accepted[i] if accepted else [n - 1 for n in r]
        on.append(
            {
                "id": f"s{i}",
                "token_ids": ids,
                "per_step_accepted": acc,
                "per_step_drafted": [k] * len(acc),
                "num_spec_tokens": k,
            }
        )
    return gt, off, on


def test_equal_walks_agree():
    gt, off, on = _records([[4, 1, 2], [3, 4]])
    on[0]["per_step_accepted"][-1] = 3  # vLLM's uncut last step: still the same once cut
    v = verdict.compare(gt, off, on, block_size=4)
    assert v["verdict"] == "agree" and v["rounds_equal"]["samples"] == 2
    assert v["offline"] == v["online"] and v["lossless"]["ok"]
    assert v["online_uncut_tau"] > v["online"]["tau_token_weighted"]


def test_a_drafter_the_engine_does_not_run_is_named():
    gt, off, on = _records([[4, 4, 2], [3, 4]], accepted=[[0] * 10, [0] * 7])
    v = verdict.compare(gt, off, on, block_size=4)
    assert v["verdict"] == "drafter_not_loaded"
    assert v["online"]["tau_token_weighted"] == 1.0
    causes = [d["cause"] for d in v["diagnosis"]]
    assert causes[-1] == "engine_disagrees" and v["lossless"]["ok"]


def test_a_disagreement_says_where_it_starts():
    gt, off, on = _records([[4, 1, 2], [3, 4]], accepted=[[3, 0, 1], [2, 1, 2]])
    v = verdict.compare(gt, off, on, block_size=4)
    assert v["verdict"] == "engine_disagrees"
    assert v["per_sample"][1]["first_divergence"] == {
        "round": 1,
        "token": 4,
        "context": 5,  # its round starts after the prompt's 2 tokens and 3 of the completion
        "offline": 4,
        "online": 2,
    }
    assert "sample s1 round 1 at token 4" in v["diagnosis"][0]["detail"]


def test_disagreements_are_placed_by_context_position():
    """Each side's rounds by where they start, per context bucket, and the bucket where
    the walks first part: a sample at 600 tokens that agrees, one at 1020 whose walks
    part at position 1024."""
    from remote.online.verdict_doc import check_verdict

    gt, off, on = _records([[4, 4, 4], [4, 4, 4]], accepted=[[3, 3, 3], [3, 1, 2, 3]])
    gt[0]["prompt_ids"], gt[1]["prompt_ids"] = [1] * 600, [1] * 1020
    v = verdict.compare(gt, off, on, block_size=4)
    assert v["per_sample"][1]["first_divergence"]["context"] == 1024
    row = {"offline_rounds": 4, "offline_tau": 4.0, "online_rounds": 4, "online_tau": 4.0}
    assert v["by_context"] == [
        {"context": 512, "diverged": 0, **row},  # both samples' first rounds
        {"context": 1024, "diverged": 1, "offline_rounds": 2, "offline_tau": 4.0,
         "online_rounds": 3, "online_tau": 8 / 3},
    ]  # fmt: skip
    check_verdict(v)  # the controller's types take it

    from orchestrator.commands.output.online import render_verdict

    v["server"] = {"engine": "vllm", "started_here": True, "url": "http://127.0.0.1:9"}
    with console_at(160) as con, con.capture() as cap:
        render_verdict(v)
    shown = cap.get()
    assert "tau by context, offline | online" in shown, shown
    assert re.search(r"^\W*1024\W+4\.000?\W+2\.667\W+2/3\W+1\W*$", shown, re.M), shown


def test_lossy_output_block_size_and_dtype_are_named():
    gt, off, on = _records([[4, 1, 2]], k=7, wrong=3)
    v = verdict.compare(gt, off, on, block_size=4, offline_dtype="float32", online_dtype="bf16")
    causes = [d["cause"] for d in v["diagnosis"]]
    assert causes[:3] == ["not_lossless", "num_speculative_tokens", "dtype"]
    assert v["per_sample"][0]["first_wrong_token"] == 3
    assert "block size is 4 (num_speculative_tokens must be 3)" in v["diagnosis"][1]["detail"]


# ---- known engine deviations ---------------------------------------------------------------


def test_which_deviations_a_server_can_have():
    from remote.online.deviations import DEVIATIONS, Engine, applies

    k_norm = next(d for d in DEVIATIONS if d.name == "vllm_cpu_shared_k_norm")
    assert applies(k_norm, Engine("vllm", "0.32.0", "cpu"), 2) is None
    assert applies(k_norm, Engine("vllm"), 3) is None  # unknown version and platform: tested
    assert "known in vllm 0.32 only" in applies(k_norm, Engine("vllm", "0.40.1", "cpu"), 2)
    assert "known on cpu only" in applies(k_norm, Engine("vllm", "0.32.0", "cuda"), 2)
    assert "this one has 1" in applies(k_norm, Engine("vllm", "0.32.0", "cpu"), 1)
    assert applies(k_norm, Engine("sglang"), 2) == "not vllm"


def test_a_deviation_is_confirmed_only_when_it_reproduces_every_differing_sample():
    from remote.online import deviations

    gt, off, on = _records(
        [[4, 1, 2], [3, 4], [2, 2, 2, 1]], accepted=[[1, 3, 3], [3, 2], [1, 1, 1, 0]]
    )
    v = verdict.compare(gt, off, on, block_size=4, offline_dtype="float32", online_dtype="float32")
    differing = verdict.disagreeing(v)
    assert list(differing) == ["s0", "s1"] and v["verdict"] == "engine_disagrees"
    engine = deviations.Engine("vllm", "0.32.0", "cpu")
    asked = []

    def reproduces(d, ids):
        asked.append((d.name, ids))
        return {sid: differing[sid] for sid in ids}

    v["deviations"] = deviations.test(differing, engine, 2, reproduces)
    verdict.conclude(v)
    assert asked == [("vllm_cpu_shared_k_norm", ["s0", "s1"])]
    assert v["verdict"] == "engine_deviation"
    line = v["diagnosis"][0]["detail"]
    assert line.startswith("rounds differ on 2 of 3 samples") and "on all 2 differing" in line
    assert "To do: " in line and "1-layer drafter" in line
    # one sample it does not reproduce: ruled out, and today's line says where to look
    v["deviations"] = deviations.test(differing, engine, 2, lambda d, ids: {"s0": differing["s0"]})
    verdict.conclude(v)
    assert v["verdict"] == "engine_disagrees"
    line = v["diagnosis"][0]["detail"]
    assert "earliest: sample s0 round 0 at token 1" in line
    assert (
        "ruled out: the output (lossless), num_speculative_tokens (3), the dtype (both float32)"
        in line
    )
    assert "vllm_cpu_shared_k_norm (simulated, it reproduces 1 of 2 differing samples)" in line
    # a one-layer drafter: not tested, and said so
    v["deviations"] = deviations.test(differing, engine, 1, reproduces)
    verdict.conclude(v)
    assert v["deviations"][0]["status"] == "not_applicable" and len(asked) == 1
    assert (
        "vllm_cpu_shared_k_norm (touches drafters of 2+ layers; this one has 1)"
        in (v["diagnosis"][0]["detail"])
    )
