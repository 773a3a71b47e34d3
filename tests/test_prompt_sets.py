"""Built-in prompt sets that match what is published (Spec-Bench; z-lab/dflash's gsm8k,
math500, humaneval, mbpp and mt-bench, and all five as `zlab`), the labels a prompt record
carries (category, sub-category) on their way into every sample record, and the seeded,
per-category choice of `--samples N`."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.eval.prompt_sets import (
    COMPOSED_SETS,
    PROMPTS_DIR,
    builtin_prompt_sets,
    prompts_data,
)
from remote.errors import UserError
from remote.eval import groundtruth
from remote.eval.inputs import read_ground_truth
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


# z-lab/dflash's benchmark sets: how many prompts it runs of each, and its instruction.
ZLAB = {"gsm8k": 128, "math500": 128, "humaneval": 164, "mbpp": 128}
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
MATH_SUBJECTS = {
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
}


def _shipped_digest(sources: str, name: str) -> str | None:
    found = re.search(
        rf"Shipped file: `{re.escape(name)}.jsonl`, sha256\s+`([0-9a-f]{{64}})`", sources
    )
    return found.group(1) if found else None


@pytest.mark.parametrize("name", sorted(ZLAB))
def test_a_zlab_set_ships_what_zlab_evaluates_with_its_source_and_license(name):
    path = builtin_prompt_sets()[name]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == ZLAB[name] and len({r["id"] for r in rows}) == len(rows)
    assert all(r["category"] == name and r["id"].startswith(f"{name}-") for r in rows)
    assert all(set(r) <= {"id", "category", "subcategory", "prompt"} for r in rows)  # small
    loaded = groundtruth.load_prompts(str(path))  # the host's reader takes every line
    assert [p["text"] for p in loaded] == [r["prompt"] for r in rows]
    if name in ("gsm8k", "math500"):
        assert all(r["prompt"].endswith(BOXED) for r in rows)
    if name == "math500":
        assert {r["subcategory"] for r in rows} == MATH_SUBJECTS
    else:
        assert not any("subcategory" in r for r in rows)
    if name == "humaneval":  # all of them, in task order, inside z-lab's instruction
        assert [r["id"] for r in rows] == [f"humaneval-{n}" for n in range(164)]
        assert all(r["prompt"].startswith("Write a solution to the following") for r in rows)
        assert all(r["prompt"].endswith("\n```") for r in rows)
    # The digest SOURCES.md records is the shipped file's; the license ships beside it.
    sources = (PROMPTS_DIR / "SOURCES.md").read_text()
    assert _shipped_digest(sources, name) == hashlib.sha256(path.read_bytes()).hexdigest()
    license_text = (PROMPTS_DIR / f"{name}.LICENSE").read_text()
    assert ("Attribution 4.0" if name == "mbpp" else "MIT License") in license_text
    assert f"### {name}" in sources


def test_mt_bench_is_spec_benchs_80_questions_not_a_second_copy():
    """`--prompts mt-bench` is the `mt_bench` lines of `spec-bench.jsonl`, byte for byte:
    no file of its own, and its labels are Spec-Bench's."""
    assert "mt-bench" not in builtin_prompt_sets()
    spec_bench = builtin_prompt_sets()["spec-bench"].read_text().splitlines()
    given = prompts_data("mt-bench")
    assert given.name == "mt-bench"
    assert given.data.decode().splitlines() == [line for line in spec_bench if '"mt_bench"' in line]
    rows = [json.loads(line) for line in given.data.decode().splitlines()]
    assert len(rows) == 80 and len({r["id"] for r in rows}) == 80
    assert Counter(r["subcategory"] for r in rows) == {c: 10 for c in MT_BENCH}
    assert [r["id"] for r in rows] == [f"spec-bench-{n}" for n in range(81, 161)]


def test_zlab_is_the_five_sets_in_one_each_prompt_labelled_with_its_set(tmp_path):
    given = prompts_data("zlab")
    assert given.data == prompts_data("zlab").data  # the same bytes: one cache entry
    path = tmp_path / "zlab.jsonl"
    path.write_bytes(given.data)
    loaded = groundtruth.load_prompts(str(path))
    assert Counter(p["category"] for p in loaded) == {**ZLAB, "mt_bench": 80}
    assert len({p["id"] for p in loaded}) == len(loaded) == 628
    five = groundtruth.load_prompts(str(path), samples=5, seed=0)  # one per z-lab set
    assert Counter(p["category"] for p in five) == {c: 1 for c in [*ZLAB, "mt_bench"]}
    assert all(
        part in builtin_prompt_sets() for parts in COMPOSED_SETS.values() for part, _ in parts
    )


def test_a_composed_set_travels_to_the_host_as_one_content_addressed_file(tmp_path):
    """The job carries the composed set's bytes under its own name, and the host reads
    them as any prompts file."""
    import base64

    from orchestrator.eval.uploads import push_prompts
    from orchestrator.inventory import HostSpec
    from orchestrator.transport.hosts import open_host

    carry: list = []
    with open_host(HostSpec(name="here", transport="local", workdir=str(tmp_path))) as host:
        entry = push_prompts(host, "zlab", carry)
    data = prompts_data("zlab").data
    assert entry["name"] == "zlab" and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert entry["path"].endswith(f"/prompts/{entry['sha256'][:16]}-zlab.jsonl")
    assert "gsm8k.jsonl" in entry["source"] and "spec-bench.jsonl (mt_bench)" in entry["source"]
    (carried,) = carry
    assert carried["path"] == entry["path"] and base64.b64decode(carried["data"]) == data


def test_an_unknown_set_is_one_line_naming_the_built_in_sets():
    with pytest.raises(DflashError) as err:
        prompts_data("gsm9k")
    message = str(err.value)
    assert "\n" not in message and "neither a built-in set" in message
    assert all(name in message for name in ("gsm8k", "math500", "mt-bench", "zlab"))
    # The options refuse it the same way before anything connects; a built-in name passes.
    from orchestrator.eval.spec import EvalOptions

    with pytest.raises(DflashError, match="neither a built-in set"):
        EvalOptions(prompts="gsm9k")
    assert EvalOptions(prompts="zlab").prompts == "zlab"


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
    from orchestrator.eval.shards.job import gt_lines

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


@pytest.mark.parametrize(
    "lines, pattern",
    [
        (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], r":2: id 'a' is line 1's"),
        (['{"prompt": "x"}', '{"id": "p-0", "prompt": "y"}'], r":2: id 'p-0' is line 1's"),
        (['{"prompt": "' + "x" * (4 * 2**20 + 1) + '"}'], r":1: the line is over 4 MiB"),
        (['{"prompt": "ok"}', "{not json"], r":2: not valid JSON"),
        (["", "  "], r"holds no prompts"),
    ],
)
def test_a_bad_prompts_file_is_one_line_on_both_sides_before_it_travels(tmp_path, lines, pattern):
    """The controller refuses what the host would, by the same rule
    (`remote.protocol.parse_prompts`), before anything is sent: duplicate ids gave two
    records with one id; a 100 MB line ran for minutes on the host."""
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DflashError, match=pattern) as local:
        prompts_data(str(path))
    with pytest.raises(UserError, match=pattern) as host:
        groundtruth.load_prompts(str(path))
    assert str(local.value) == str(host.value) and "\n" not in str(local.value)


def test_the_host_refuses_a_prompts_file_other_than_the_one_sent(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(groundtruth.load_prompts(str(path), sha256=sha)) == 2
    path.write_text('{"prompt": "one"}\n')  # cut at a line: it would have run on fewer
    with pytest.raises(UserError, match=r"not the file the controller sent"):
        groundtruth.load_prompts(str(path), sha256=sha)
