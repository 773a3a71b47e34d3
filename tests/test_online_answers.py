"""What a serving engine answers, through the real client (`remote.online.vllm.measure`)
against a loopback server answering as vLLM 0.32 does (`tests/helpers/scripted_vllm.py`),
into the verdict an online job writes (`remote.online.report.build`): impossible counts
and counters that do not move, go backwards or are negative give the verdict
``engine_answer_invalid`` naming the field, never a tau; the same prompts at several
concurrency levels and against a server without the drafter give tokens per second per
level and the speedup measured."""

from __future__ import annotations

import pytest

from remote.online import report, verdict
from remote.online.verdict_doc import check_verdict
from remote.online.vllm import measure
from tests.helpers.scripted_vllm import ScriptedVllm, steps_for

K = 3


def ground_truth(samples: int = 6, tokens: int = 16) -> list[dict]:
    return [
        {
            "id": f"s{i}",
            "prompt_ids": [1, 2, 3 + i],
            "completion_ids": list(range(10 + i, 10 + i + tokens)),
        }
        for i in range(samples)
    ]


def offline(rows: list[dict]) -> list[dict]:
    """The walk the scripted server's drafter makes (it reproduces it round by round)."""
    out = []
    for r in rows:
        n = len(r["completion_ids"])
        out.append({"id": r["id"], "rounds": verdict.cut_rounds(steps_for(n, K, "ok"), n - 1)[0]})
    return out


def run(rows: list[dict], mode: str = "ok", levels=(1,), baseline: bool = False) -> dict:
    """The verdict of `rows` measured at `levels` on a scripted server in `mode` (and,
    with `baseline`, on one without the drafter), as an online job puts it together."""

    def at_levels(server: ScriptedVllm) -> list[dict]:
        return [
            {"concurrency": c, **measure(server.url, rows, 320, concurrency=c, settle_s=1.0)}
            for c in levels
        ]

    with ScriptedVllm(rows, K, mode) as server:
        measured = {"levels": at_levels(server), "server": {"engine": "vllm", "url": server.url}}
    base = None
    if baseline:
        with ScriptedVllm(rows, None) as plain:
            base = {
                "levels": at_levels(plain),
                "started_here": False,
                "url": plain.url,
                "startup_s": None,
            }
    v = report.build(rows, offline(rows), measured, base, block_size=K + 1)
    check_verdict(v)  # what the controller checks before writing it
    return v


def test_a_truthful_server_agrees():
    v = run(ground_truth())
    assert v["verdict"] == "agree", v["diagnosis"]
    assert v["online"] == v["offline"] and v["invalid"] == []
    assert v["server"]["counters_agree"] is True


def test_the_issues_impossible_counts_are_refused_not_a_tau():
    """15 verify steps each accepting 3 tokens for 16 output tokens: main took it as tau
    3.750 and said engine_disagrees."""
    v = run(ground_truth(tokens=16), mode="impossible")
    assert v["verdict"] == "engine_answer_invalid", v["diagnosis"]
    assert v["online"] is None and v["online_uncut_tau"] is None
    assert v["invalid"][0]["field"] == "metrics.speculative_decoding.per_step_accepted"
    line = v["diagnosis"][0]["detail"]
    assert "15 verify steps accepting 45 draft tokens for 16 output tokens is impossible" in line
    assert "no online tau" in line and "\n" not in line
    assert v["lossless"]["ok"]  # the ids are still read and checked


@pytest.mark.parametrize(
    "mode, field, words",
    [
        ("frozen", "vllm:spec_decode_num_drafts_total", "did not move over 6 requests"),
        ("backwards", "vllm:spec_decode_num_drafts_total", "went backwards"),
        ("negative", "vllm:spec_decode_num_drafts_total", "is -5.0, not a whole count"),
    ],
)
def test_counters_that_cannot_be_true_are_refused(mode, field, words):
    """Main showed frozen counters only as counters_agree false inside verdict.json, and
    failed the whole job on counters that went backwards or below zero."""
    v = run(ground_truth(), mode=mode)
    assert v["verdict"] == "engine_answer_invalid", v["diagnosis"]
    assert v["invalid"][0]["field"] == field and v["online"] is None
    assert words in v["diagnosis"][0]["detail"]


def test_concurrency_levels_give_acceptance_and_speed_per_level():
    v = run(ground_truth(8), levels=(1, 4, 8))
    assert [lv["concurrency"] for lv in v["levels"]] == [1, 4, 8]
    assert all(lv["same_rounds_as_first"] == 8 for lv in v["levels"][1:])
    assert all(lv["tokens_per_s"] > 0 and lv["lossless"] == 8 for lv in v["levels"])
    assert len({lv["tau_token_weighted"] for lv in v["levels"]}) == 1
    assert v["verdict"] == "agree", v["diagnosis"]


def test_acceptance_that_changes_with_the_batch_is_flagged():
    rows = ground_truth()
    v = run(rows, levels=(1, 4))
    moved = v["levels"][1]
    moved["same_rounds_as_first"] = 4  # what a batched engine bug looks like
    verdict.conclude(v)
    assert v["verdict"] == "batch_changes_acceptance"
    assert (
        "at concurrency 4 the engine's rounds differ from concurrency 1's on 2 of 6"
        in (v["diagnosis"][0]["detail"])
    )


def test_a_baseline_gives_the_speedup_measured():
    v = run(ground_truth(), levels=(1, 2), baseline=True)
    base = v["baseline"]
    assert [b["concurrency"] for b in base["levels"]] == [1, 2]
    assert all(b["lossless"] == 6 and b["tokens_per_s"] > 0 for b in base["levels"])
    for lv, b in zip(v["levels"], base["levels"], strict=True):
        assert lv["speedup"] == pytest.approx(lv["tokens_per_s"] / b["tokens_per_s"])
    # the plain server's decode time per token beside the drafter's (both scripted equal)
    assert base["decode_speedup"] == pytest.approx(1.0)
    assert v["verdict"] == "agree"
