"""Prompts given as token ids (``{"id", "prompt_ids"}`` lines): a target without tokenizer
files gets a sampled local ground truth made for it, each completion its own record, and
ids outside the target's vocabulary are refused in one line before anything is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote.errors import UserError
from remote.eval import groundtruth
from tests.helpers.checkpoints import without_tokenizer

PROMPTS = {"a": [5, 17, 42, 99, 7], "b": [3, 61, 12, 8]}


def job(tmp_path: Path, target: Path, prompts: Path) -> dict:
    return {
        "eval": {"target": str(target), "dtype": "float32"},
        "workdir": str(tmp_path / "wd"),
        "prompts": {"path": str(prompts)},
        "seed": 0,
        "sampling": {"temperature": 0.8, "seed": 3, "completions": 2, "max_new_tokens": 6},
        "ground_truth": {"kind": "local", "timeout": 20},
    }


def test_token_id_prompts_get_a_sampled_local_ground_truth_without_a_tokenizer(
    tmp_path, tiny_target
):
    notok = without_tokenizer(tiny_target, tmp_path / "notok")
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": k, "prompt_ids": v}) + "\n" for k, v in PROMPTS.items())
    )
    path, info = groundtruth.prepare(job(tmp_path, notok, prompts))
    rows = [json.loads(x) for x in Path(path).read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a#0", "a#1", "b#0", "b#1"]
    assert [(r["prompt_id"], r["index"]) for r in rows] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all(r["prompt_ids"] == PROMPTS[r["prompt_id"]] for r in rows)
    assert all(1 <= len(r["completion_ids"]) <= 6 for r in rows)
    assert info["sampling"]["temperature"] == 0.8 and info["sampling"]["completions"] == 2
    assert info["chat_template_sha256"] is None

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "z", "prompt_ids": [1, 2, 10**6]}) + "\n")
    spec = job(tmp_path / "bad", notok, bad)
    with pytest.raises(UserError) as err:
        groundtruth.prepare(spec)
    line = str(err.value)
    assert "\n" not in line and "prompt z" in line and "token id 1000000" in line
    assert not list((tmp_path / "bad" / "wd" / "groundtruth").glob("*.jsonl"))
