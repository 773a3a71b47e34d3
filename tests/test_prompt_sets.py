"""Built-in prompt sets that match what is published (Spec-Bench), the labels a prompt
record carries (category, sub-category) on their way into every sample record, and the
seeded, per-category choice of `--samples N`."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.eval.spec import PROMPTS_DIR, builtin_prompt_sets
from remote.errors import UserError
from remote.eval import groundtruth
from remote.eval.engine import read_ground_truth
from remote.protocol import ResultError, check_record

SPEC_BENCH = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
MT_BENCH = {
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
}


def test_spec_bench_ships_its_480_questions_with_categories_source_and_license():
    path = builtin_prompt_sets()["spec-bench"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 480 and len({r["id"] for r in rows}) == 480
    assert Counter(r["category"] for r in rows) == {c: 80 for c in SPEC_BENCH}
    mt = [r for r in rows if r["category"] == "mt_bench"]
    assert Counter(r["subcategory"] for r in mt) == {c: 10 for c in MT_BENCH}
    assert all(len(r["turns"]) == 2 for r in mt)
    assert not any("subcategory" in r for r in rows if r["category"] != "mt_bench")
    # The eval puts the first turn: what load_prompts gives, with the labels.
    loaded = groundtruth.load_prompts(str(path))
    assert [p["text"] for p in loaded] == [r["turns"][0] for r in rows]
    assert loaded[0] == {
        "id": "spec-bench-81",
        "text": rows[0]["turns"][0],
        "category": "mt_bench",
        "subcategory": "writing",
    }
    # Its source, license and the shipped file's digest are recorded, and still true.
    sources = (PROMPTS_DIR / "SOURCES.md").read_text()
    shipped = re.search(r"Shipped file: `spec-bench.jsonl`, sha256\s+`([0-9a-f]{64})`", sources)
    assert shipped and shipped.group(1) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "fd2c1cd7d2201ef71db4c5f4e455008f017967bf" in sources and "Apache-2.0" in sources
    assert "Apache License" in (PROMPTS_DIR / "spec-bench.LICENSE").read_text()


def test_a_small_seeded_choice_covers_every_category():
    path = str(builtin_prompt_sets()["spec-bench"])
    six = groundtruth.load_prompts(path, samples=6, seed=0)
    assert Counter(p["category"] for p in six) == {c: 1 for c in SPEC_BENCH}
    assert six == groundtruth.load_prompts(path, samples=6, seed=0)  # seeded
    assert six != groundtruth.load_prompts(path, samples=6, seed=1)
    every = groundtruth.load_prompts(path)
    assert [every.index(p) for p in six] == sorted(every.index(p) for p in six)  # file order
    sixty = groundtruth.load_prompts(path, samples=60, seed=3)
    assert Counter(p["category"] for p in sixty) == {c: 10 for c in SPEC_BENCH}
    three = groundtruth.load_prompts(path, samples=3, seed=0)
    assert len({p["category"] for p in three}) == 3
    # Uneven categories share the rest in proportion, one each first.
    assert Counter(r["category"] for r in groundtruth.select(_uneven(), 6, 0)) == {
        "a": 4,
        "b": 1,
        "c": 1,
    }


def _uneven() -> list[dict]:
    sizes = {"a": 20, "b": 2, "c": 2}
    return [{"id": f"{c}{i}", "category": c} for c, n in sizes.items() for i in range(n)]


def test_a_set_without_categories_is_chosen_as_it_always_was():
    """The seeded choice of an unlabelled set (and so its ground-truth cache entries) is
    the one it was before categories existed."""
    picked = groundtruth.load_prompts(str(builtin_prompt_sets()["chat"]), samples=5, seed=0)
    assert [p["id"] for p in picked] == ["chat-01", "chat-08", "chat-12", "chat-13", "chat-24"]
    assert all(set(p) == {"id", "text"} for p in picked)


@pytest.mark.parametrize(
    "label, pattern",
    [
        (7, r"category is 7 \(an integer\), expected a string"),
        ("=HYPERLINK(1)", r"category is .*starting with a letter or digit"),
        ("x" * 65, r"category is .*up to 64 letters"),
    ],
)
def test_a_bad_label_is_one_line_wherever_it_comes_from(tmp_path, label, pattern):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi", "category": label}) + "\n")
    with pytest.raises(UserError, match=r"p.jsonl:1: " + pattern) as err:
        groundtruth.load_prompts(str(prompts))
    assert "\n" not in str(err.value)
    gt = tmp_path / "gt.jsonl"
    gt.write_text(
        json.dumps({"id": "a", "category": label, "prompt_ids": [1], "completion_ids": [2]}) + "\n"
    )
    with pytest.raises(UserError, match=pattern):
        groundtruth.read_ground_truth_file(str(gt))
    with pytest.raises(UserError, match=pattern):
        read_ground_truth(str(gt), vocab=10, max_samples=None)
    # A host's sample record with such a label is refused by the controller.
    with pytest.raises(ResultError, match=pattern):
        check_record({"id": "a", "rounds": [1], "category": label})


def test_labels_travel_from_the_prompt_to_the_ground_truth_and_the_engines_rows(
    tmp_path, tiny_target, server
):
    prompts = tmp_path / "labelled.jsonl"
    prompts.write_text(
        json.dumps({"id": "q1", "prompt": "Two plus two?", "category": "math"})
        + "\n"
        + json.dumps({"id": "q2", "turns": ["Hi", "more"], "category": "chat", "subcategory": "x"})
        + "\n"
    )
    spec = {
        "eval": {"target": str(tiny_target), "dtype": "float32"},
        "workdir": str(tmp_path / "wd"),
        "prompts": {"path": str(prompts)},
        "sampling": {"temperature": 0, "max_new_tokens": 4},
        "ground_truth": {"kind": "sglang", "url": server.url, "timeout": 20},
    }
    path, info = groundtruth.prepare(spec)
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [(r["id"], r.get("category"), r.get("subcategory")) for r in lines] == [
        ("q1", "math", None),
        ("q2", "chat", "x"),
    ]
    rows = read_ground_truth(path, vocab=10_000, max_samples=None)
    assert [(r["id"], r.get("category")) for r in rows] == [("q1", "math"), ("q2", "chat")]
    # The same prompts without labels are another cache entry (its lines carry none).
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"id": "q1", "prompt": "Two plus two?"}\n{"id": "q2", "prompt": "Hi"}\n')
    _, other = groundtruth.prepare({**spec, "prompts": {"path": str(plain)}})
    assert other["cache_key"] != info["cache_key"]
    assert info["thinking"] is False and re.fullmatch(r"[0-9a-f]{64}", info["chat_template_sha256"])


def test_a_shards_ground_truth_slice_keeps_the_labels():
    """A sharded eval slices the ground truth it made once: each slice's lines keep their
    prompt's labels, so the shard's sample records carry them as one host's would."""
    from orchestrator.eval.shard_job import gt_lines

    records = [
        {"id": "a", "category": "qa", "prompt_ids": [1], "completion_ids": [2]},
        {
            "id": "b",
            "category": "mt_bench",
            "subcategory": "stem",
            "prompt_ids": [3],
            "completion_ids": [4],
        },
        {"id": "c", "prompt_ids": [5], "completion_ids": [6]},
    ]
    lines = [json.loads(line) for line in gt_lines(records, [1, 2]).splitlines()]
    assert lines == records[1:]
