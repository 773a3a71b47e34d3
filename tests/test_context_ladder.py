"""Long contexts without a download (#51): a prompt's own conversation (``messages``), the
context ladder a job builds on its host (each chosen prompt after a history of the set's
other questions with the target's own answers, at each rung), and the drafter's window
checked by the preflight against the longest context the job will reach: one warning line
before anything loads, the exact check recorded in the result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.eval.prompt_sets import builtin_prompt_sets
from remote.errors import UserError
from remote.model.window import check, window
from remote.protocol import SpecError, parse_prompts
from remote.protocol.ladder import RUNG_OVER, parse_rungs
from tests.helpers import evalkit
from tests.helpers.jobs import run_eval_job


def test_a_window_counts_rope_scaling_and_sliding_layers():
    assert window({"max_position_embeddings": 2048}).reach == 2048
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert window({"max_position_embeddings": 32768, "rope_scaling": yarn}).reach == 131072
    linear = {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    assert window({"max_position_embeddings": 4096, **linear}).reach == 8192
    slide = {"max_position_embeddings": 2048, "num_hidden_layers": 2, "sliding_window": 512}
    both = {**slide, "layer_types": ["sliding_attention", "sliding_attention"]}
    assert window(both).reach is None and check(both, 10**6) is None  # never looks that far
    one = {**slide, "layer_types": ["sliding_attention", "full_attention"]}
    assert window(one).reach == 2048
    line = check(one, 17000)
    assert "window is 2048 positions" in line and "reach 17000 tokens" in line
    assert "1 of 2 layers slide (window 512)" in line
    assert check({"max_position_embeddings": 2048}, 2048) is None
    assert check({}, 10**6) is None  # no window named: nothing to say


def test_ladder_rungs_parse_once_for_both_sides():
    assert parse_rungs("1k, 2k,512,4K") == [512, 1024, 2048, 4096]
    for bad in ("1k,two", "8", "99999999"):
        with pytest.raises(SpecError):
            parse_rungs(bad)


def test_a_conversation_record_is_a_prompt_of_its_own():
    """A user's long prompt with its history: turns taken in order, the user's last, and
    rendered whole with the target's chat template."""
    from remote.eval.groundtruth.prompts import load_tokenizer, render_prompt

    talk = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ]
    (rec,) = parse_prompts([(1, json.dumps({"id": "c", "messages": talk}).encode())], "f", "f")
    assert rec["messages"] == talk and rec["text"] == "Another?"
    tok = load_tokenizer(evalkit.kit("qwen3").target)
    text, ids = render_prompt(tok, rec, False)
    assert text.index("Name a colour.") < text.index("Blue.") < text.index("Another?")
    assert text.endswith("<|im_start|>assistant\n") and ids == tok(text)["input_ids"]
    for bad, says in (
        (talk[1:3], "the user's comes last"),
        ([talk[1], talk[1]], "take turns"),
        ([talk[1], talk[0], talk[3]], "system message may only come first"),
        ([{"role": "robot", "content": "x"}], "message 1 is not"),
    ):
        with pytest.raises(SpecError, match=says):
            parse_prompts([(1, json.dumps({"messages": bad}).encode())], "f", "f")


def job_spec(tmp_path: Path, drafter: str, rungs: list[int], job_id: str) -> dict:
    return {
        "kind": "eval",
        "eval": {"target": evalkit.kit("qwen3").target, "drafter": drafter, "dtype": "float32"},
        "ground_truth": {"kind": "local", "concurrency": 4},
        "prompts": {"path": str(builtin_prompt_sets()["chat"])},
        "samples": 3,
        "sampling": {"max_new_tokens": 12},
        "context_ladder": rungs,
        "workdir": str(tmp_path / "work"),
        "job_id": job_id,
        "feature_cache": False,
    }


def run_job(tmp_path: Path, spec: dict) -> tuple[Path, list[dict]]:
    folder = tmp_path / "work" / "jobs" / spec["job_id"]
    return folder, run_eval_job(folder, spec)


def narrow(src: str, dst: Path, positions: int) -> str:
    """The drafter at `src` with its window set to `positions`."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": positions}))
    return str(dst)


def test_a_ladder_job_puts_each_prompt_at_each_rung_with_the_window_checked(tmp_path):
    """Three chat prompts at 256 and 512 tokens on the tiny Qwen3 target, its ground truth
    made locally: each conversation lands on its rung, its history the set's other
    questions with the target's answers (made once: a second job reads them back); a
    drafter whose window (300) the ladder passes is warned about before anything loads,
    the result records the exact check and gives tau per context bucket."""
    from remote.eval.groundtruth.prompts import load_tokenizer, render_prompt

    kit = evalkit.kit("qwen3")
    small = narrow(kit.steps[-1], tmp_path / "small", 300)
    folder, log = run_job(tmp_path, job_spec(tmp_path, small, [256, 512], "j1"))
    warnings = [i for i, e in enumerate(log) if e.get("event") == "warning"]
    phases = [i for i, e in enumerate(log) if e.get("event") == "phase"]
    assert len(warnings) == 1 and warnings[0] < phases[0], log[:5]
    line = log[warnings[0]]["message"]
    assert "window is 300 positions" in line and f"reach {512 + RUNG_OVER + 12} tokens" in line

    tok = load_tokenizer(kit.target)
    ladder = [json.loads(x) for x in (folder / "ladder_prompts.jsonl").read_text().splitlines()]
    assert [r["id"].split("@")[1] for r in ladder] == ["256"] * 3 + ["512"] * 3
    chat = parse_prompts(
        [(1, x.encode()) for x in builtin_prompt_sets()["chat"].read_text().splitlines()],
        "c",
        "c",
    )
    for rec in ladder:
        rung = int(rec["id"].split("@")[1])
        n = len(render_prompt(tok, rec, False)[1])
        assert rung <= n <= rung + RUNG_OVER, (rec["id"], n)
        talk = rec["messages"]
        assert [m["role"] for m in talk] == ["user", "assistant"] * (len(talk) // 2) + ["user"]
        final = next(p for p in chat if p["id"] == rec["id"].split("@")[0])
        assert talk[-1]["content"] == final["text"] and final["text"] not in [
            m["content"] for m in talk[:-1]
        ]
    gt = json.loads((folder / "ground_truth.json").read_text())
    assert gt["ladder"]["rungs"] == [256, 512] and gt["ladder"]["history_questions"] > 3
    assert not any(h["cached"] for h in gt["ladder"]["history_ground_truth"])

    result = json.loads((folder / "result.json").read_text())
    got = result["inputs"]["drafter_window"]
    assert got["window"]["reach"] == 300 and got["longest_context"] > 512
    assert got["warning"] and "300" in got["warning"]
    buckets = [r["context"] for r in result["metrics"]["tau_by_context"]]
    assert buckets == [0, 512] and result["metrics"]["context_cliff"]

    # the same ladder again, with a drafter whose window covers it: no warning; the
    # history's answers and the ladder's completions come from the host's cache
    wide = narrow(kit.steps[-1], tmp_path / "wide", 4096)
    folder, log = run_job(tmp_path, job_spec(tmp_path, wide, [256, 512], "j2"))
    assert not [e for e in log if e.get("event") == "warning"]
    gt = json.loads((folder / "ground_truth.json").read_text())
    assert gt["cached"] and all(h["cached"] for h in gt["ladder"]["history_ground_truth"])
    result = json.loads((folder / "result.json").read_text())
    assert result["inputs"]["drafter_window"]["warning"] is None


def test_a_ladder_past_the_target_s_window_is_refused_before_anything(tmp_path):
    kit = evalkit.kit("qwen3")
    spec = job_spec(tmp_path, kit.steps[-1], [1024, 32768], "j3")  # the window: 32768
    with pytest.raises(UserError, match=r"ladder reaches \d+ tokens but the target's window"):
        run_job(tmp_path, spec)
    assert json.loads((tmp_path / "work/jobs/j3/preflight.json").read_text())["ok"] is False
