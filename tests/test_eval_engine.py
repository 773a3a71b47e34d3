"""The offline walk equals online greedy speculative decoding, round by round.

The oracle (`tests/helpers/oracle.py`) is written independently of the engine: it drives
the HF model classes (full wrapper for the VLM) with ``output_hidden_states`` and, for
Qwen3, a real KV cache cropped after each verification; for the hybrid Qwen3.5 target
(recurrent state cannot be cropped) it re-runs the target over the whole accepted prefix
every round. The drafter is called one block at a time with its context grown by the
accepted tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from remote.errors import UserError
from remote.eval.drafter import load_drafter
from remote.eval.engine import run_eval
from remote.eval.inputs import read_spec
from remote.eval.target import load_target
from remote.eval.walk import WalkOptions, eval_batch, eval_sequence, summarize
from remote.protocol import EvalSpec
from tests.helpers.evalkit import kit
from tests.helpers.oracle import hf_model, online_rounds, plain_ddtree_rounds


@pytest.mark.parametrize("kind", ["qwen3", "qwen35"])
def test_offline_walk_equals_online_decoding(kind):
    k = kit(kind)
    model = hf_model(k.target)
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    all_online = []
    for row in k.rows[:6]:
        rounds, completion = online_rounds(
            model,
            drafter,
            row["prompt_ids"],
            len(row["completion_ids"]),
            recompute=(kind == "qwen35"),
        )
        # speculative greedy decoding reproduces the target's greedy completion
        assert completion == row["completion_ids"]
        rec = eval_sequence(target, drafter, row["prompt_ids"], completion, WalkOptions())
        assert rec["rounds"] == rounds
        assert rec["agreement"]["match"] == rec["agreement"]["total"]
        all_online.append(rounds)
    mean_len = sum(map(sum, all_online)) / sum(map(len, all_online))
    assert mean_len >= 1.5, (
        f"drafter accepts too little to make the comparison meaningful: {mean_len}"
    )


def test_ddtree_chain_limit_and_budget_bound():
    k = kit("qwen3")
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    B = drafter.block_size
    for row in k.rows[:4]:
        chain = eval_sequence(
            target,
            drafter,
            row["prompt_ids"],
            row["completion_ids"],
            WalkOptions(budgets=[B - 1], topk=1),
        )
        # top-1 per depth with B-1 nodes is exactly the greedy chain
        assert chain["ddtree"][str(B - 1)] == chain["rounds"]
        wide = eval_sequence(
            target,
            drafter,
            row["prompt_ids"],
            row["completion_ids"],
            WalkOptions(budgets=[1, 2, 64]),
        )
        assert max(wide["ddtree"]["1"]) <= 2 and max(wide["ddtree"]["2"]) <= 3
        assert sum(wide["ddtree"]["64"]) == sum(wide["rounds"]) == len(row["completion_ids"]) - 1


def test_ddtree_walks_equal_the_plain_per_position_trees():
    """The engine's lazy, batched tree search gives the very rounds of building every
    budget's whole tree at every position from a separately drafted block."""
    k = kit("qwen3")
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    budgets = [1, 2, 4, 8, 16, 64]
    deep = 0
    for topk in (None, 2):
        for row in k.rows[:3]:
            p, c = row["prompt_ids"], row["completion_ids"]
            want = plain_ddtree_rounds(target, drafter, p, c, budgets, topk)
            for extra in ({"positions": "all"}, {}, {"block_chunk": 2}):
                opts = WalkOptions(budgets=budgets, topk=topk, **extra)
                assert eval_sequence(target, drafter, p, c, opts)["ddtree"] == want
            deep += max(max(r) for r in want.values()) >= 3
    assert deep >= 2  # the trees accepted paths past depth 1, not only first tokens


def test_walk_positions_give_the_walks_of_all_positions_with_less_drafting():
    k = kit("qwen3")
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    for row in k.rows[:3]:
        full = eval_sequence(
            target,
            drafter,
            row["prompt_ids"],
            row["completion_ids"],
            WalkOptions(budgets=[3, 8], positions="all"),
        )
        lazy = eval_sequence(
            target,
            drafter,
            row["prompt_ids"],
            row["completion_ids"],
            WalkOptions(budgets=[3, 8], positions="walk"),
        )
        assert lazy["rounds"] == full["rounds"] and lazy["ddtree"] == full["ddtree"]
        assert full["positions_drafted"] == len(row["completion_ids"]) - 1
        assert lazy["positions_drafted"] < full["positions_drafted"]


def test_the_default_eval_drafts_where_rounds_start():
    """The default (spec and options) drafts blocks only where the walks start rounds; its
    per-position acceptance covers the chain walk's round starts, and `--positions all`
    (opt-in) every completion position."""
    assert EvalSpec().positions == WalkOptions().positions == "walk"
    k = kit("qwen3")
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    row = k.rows[0]
    p, c = row["prompt_ids"], row["completion_ids"]
    rec = eval_sequence(target, drafter, p, c, WalkOptions(budgets=[4]))
    every = eval_sequence(target, drafter, p, c, WalkOptions(budgets=[4], positions="all"))
    assert rec["rounds"] == every["rounds"] and rec["ddtree"] == every["ddtree"]
    assert rec["position_attempts"][0] == len(rec["rounds"]) < len(c) - 1
    assert every["position_attempts"][0] == len(c) - 1


def test_walks_draft_each_block_once_and_evicted_blocks_give_the_same_rounds(monkeypatch):
    """The greedy and DDTree walks share what they draft: a block the chain walk drafted
    is not drafted again for a tree search there, nor the reverse (its last layer's inputs
    are kept), in either positions mode; with no room to keep blocks they are drafted again
    and every round is the same."""
    import remote.eval.drafts as drafts

    k = kit("qwen3")
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in k.rows[:3]]
    built: list = []
    build = drafts.Drafts._build

    def counted(self, keys):
        built.extend(keys)
        return build(self, keys)

    monkeypatch.setattr(drafts.Drafts, "_build", counted)
    got = {}
    for positions in ("walk", "all"):
        built.clear()
        opts = WalkOptions(budgets=[3, 8, 32], positions=positions)
        got[positions] = eval_batch(target, drafter, samples, opts)
        assert built and len(built) == len(set(built))  # no block drafted twice
        assert sum(r["blocks_drafted"] for r in got[positions]) == len(built)
    monkeypatch.setattr(drafts, "KEPT_BYTES", 0)
    built.clear()
    again = eval_batch(target, drafter, samples, WalkOptions(budgets=[3, 8, 32], positions="walk"))
    assert len(built) > len(set(built))  # the searches drafted blocks again
    for a, b, c in zip(got["walk"], got["all"], again, strict=True):
        assert a["rounds"] == b["rounds"] == c["rounds"] and a["rounds"]
        assert a["ddtree"] == b["ddtree"] == c["ddtree"]
    assert any(max(r) >= 2 for rec in again for r in rec["ddtree"].values())


def test_per_position_over_all_positions_and_summary():
    k = kit("qwen3")
    drafter, _ = load_drafter(k.steps[-1], torch.float32)
    target = load_target(k.target, torch.float32)
    row = k.rows[0]
    rec = eval_sequence(
        target, drafter, row["prompt_ids"], row["completion_ids"], WalkOptions(positions="all")
    )
    C = len(row["completion_ids"])
    assert rec["position_attempts"][0] == C - 1  # every completion position is drafted
    # brute force a_s for every s with single-block drafting
    g = row["prompt_ids"] + row["completion_ids"]
    P, L, B = len(row["prompt_ids"]), len(g) - 1, drafter.block_size
    feats, _ = target.forward(g, drafter.cfg.target_layer_ids)
    hits = [0] * (B - 1)
    for s in range(P, L):
        h = drafter.forward_block(
            feats[:s], drafter.block_inputs(target.embed, torch.tensor([g[s]]))[0], s
        )
        d = drafter.logits(h[1:], target.lm_head).argmax(-1).tolist()
        a = 0
        while a < B - 1 and s + a + 1 <= L and d[a] == g[s + a + 1]:
            a += 1
        for j in range(a):
            hits[j] += 1
    assert rec["position_hits"] == hits
    summary = summarize([rec], B, [], None, target.info.vocab_size)
    assert sum(summary["acceptance_histogram"].values()) == len(rec["rounds"])
    assert summary["tau_token_weighted"] == pytest.approx((C - 1) / len(rec["rounds"]))


def test_target_hooks_give_raw_layer_outputs_and_skip_vision():
    k = kit("qwen35")
    target = load_target(k.target, torch.float32)
    model = hf_model(k.target)
    g = k.rows[0]["prompt_ids"] + k.rows[0]["completion_ids"]
    n = target.info.num_layers
    feats, greedy = target.forward(g, [1, n - 1])
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([g]), output_hidden_states=True)
    H = target.info.hidden_size
    torch.testing.assert_close(feats[:, :H], out.hidden_states[2][0])
    # the last entry of output_hidden_states is final-normed; the hook gives the raw output
    assert not torch.allclose(feats[:, H:], out.hidden_states[n][0], atol=1e-3)
    torch.testing.assert_close(target.backbone.norm(feats[:, H:]), out.hidden_states[n][0])
    assert greedy.tolist() == out.logits[0].argmax(-1).tolist()
    loaded = [name for name, p in target.model.named_parameters() if not p.is_meta]
    assert loaded and not any("visual" in name for name in loaded)
    assert any("visual" in name for name, _ in target.model.named_parameters())


def run_cli(spec: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run(
        [sys.executable, "-m", "remote", "eval", "--spec", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def write_gt(rows, path) -> str:
    with open(path, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return str(path)


def test_eval_command_end_to_end_and_acceptance_rises_with_step(tmp_path):
    k = kit("qwen3")
    gt = write_gt(k.rows[:5], tmp_path / "gt.jsonl")
    taus = []
    for i, step in enumerate((k.steps[0], k.steps[-1])):
        out = tmp_path / f"out{i}"
        proc = run_cli(
            {
                "target": k.target,
                "drafter": step,
                "ground_truth": gt,
                "output_dir": str(out),
                "dtype": "fp32",
                "threads": 1,
                "budgets": [4, 16],
                "max_samples": 4,
            },
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [e["event"] for e in events] == ["start"] + ["sample"] * 4 + ["done"]
        assert [e["done"] for e in events[1:-1]] == [1, 2, 3, 4] and events[1]["total"] == 4
        result = json.loads(open(events[-1]["result"]).read())
        assert result["schema"] == "dflash.eval/1"
        assert set(result) >= {"inputs", "environment", "metrics", "timings"}
        assert result["environment"]["dtype"] == "float32" and result["environment"]["threads"] == 1
        assert result["inputs"]["ddtree"] == {"budgets": [4, 16], "topk": None}
        m = result["metrics"]
        assert set(m["ddtree"]) == {"4", "16"} and m["ddtree"]["4"]["topk"] == 4
        assert len(m["per_position_acceptance"]) == 3 and len(m["acceptance_histogram"]) == 4
        samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == 4 and all(s["rounds"] for s in samples)
        assert events[-2]["tau_per_sample_mean"] == pytest.approx(m["tau_per_sample_mean"])
        assert not [p for p in os.listdir(out) if ".tmp" in p]
        taus.append(m["tau_per_sample_mean"])
    assert taus[1] > taus[0] + 0.3


def edited_drafter(src: str, dst, **changes) -> str:
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if key in ("target_layer_ids", "mask_token_id"):
            cfg["dflash_config"][key] = value
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


@pytest.mark.parametrize(
    "case,expect",
    [
        ("layer_ids", "outside the target's 4 layers"),
        ("vocab", "vocab_size"),
        ("hidden", "hidden_size"),
        ("token", "outside the target vocabulary"),
        ("empty", "empty completion_ids"),
    ],
)
def test_user_errors_before_any_weight_is_loaded(tmp_path, case, expect):
    import shutil

    k = kit("qwen3")
    # a target folder WITHOUT weights: every error below must come before loading them
    target = tmp_path / "target"
    target.mkdir()
    shutil.copy(os.path.join(k.target, "config.json"), target / "config.json")
    rows = [dict(r) for r in k.rows[:2]]
    drafter = k.steps[-1]
    if case == "layer_ids":
        drafter = edited_drafter(drafter, tmp_path / "d", target_layer_ids=[1, 7])
    elif case == "vocab":
        drafter = edited_drafter(drafter, tmp_path / "d", vocab_size=999)
    elif case == "hidden":
        drafter = edited_drafter(drafter, tmp_path / "d", hidden_size=32)
    elif case == "token":
        rows[1]["completion_ids"] = rows[1]["completion_ids"][:-1] + [10**6]
    elif case == "empty":
        rows[1]["completion_ids"] = []
    gt = write_gt(rows, tmp_path / "gt.jsonl")
    spec = {
        "target": str(target),
        "drafter": drafter,
        "ground_truth": gt,
        "output_dir": str(tmp_path / "o"),
    }
    events = []
    with pytest.raises(UserError, match=expect) as err:
        run_eval(spec_of(spec, tmp_path), on_event=events.append)
    assert "\n" not in str(err.value)
    assert events == []  # not even a start event: nothing was loaded


def test_cli_prints_one_error_line_and_exits_3(tmp_path):
    k = kit("qwen3")
    rows = [dict(k.rows[0], completion_ids=[])]
    gt = write_gt(rows, tmp_path / "gt.jsonl")
    proc = run_cli(
        {
            "target": k.target,
            "drafter": k.steps[-1],
            "ground_truth": gt,
            "output_dir": str(tmp_path / "o"),
        },
        tmp_path,
    )
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("dflash-remote: error: ")
        and "empty completion_ids" in lines[0]
    )
    assert proc.stdout == ""


def spec_of(spec: dict, tmp_path) -> EvalSpec:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    return read_spec(str(path))


def test_memory_check_refuses_before_loading(tmp_path):
    from remote.eval.drafter import read_config
    from remote.eval.memory import estimate_bytes

    k = kit("qwen3")
    cfg = read_config(k.steps[-1])
    small = estimate_bytes(10**6, cfg, 100, 4, 64)
    big = estimate_bytes(10**6, cfg, 100_000, 4, 64)
    assert small > 10**6 and big > small
    # above temperature 0 the seeded walks keep each sequence's final rows and uniforms
    hot = estimate_bytes(10**6, cfg, 100_000, 4, 64, sampled=True)
    assert hot - big >= 100_000 * cfg.hidden_size * 4
    every = estimate_bytes(10**6, cfg, 100_000, 4, 64, "all")  # the DP keeps no walk rows
    assert estimate_bytes(10**6, cfg, 100_000, 4, 64, "all", sampled=True) == every
    # a target whose text weights cannot fit: scale the config up, keep no weights
    cfg_json = json.loads(open(os.path.join(k.target, "config.json")).read())
    cfg_json.pop("layer_types", None)
    cfg_json.update(
        hidden_size=8192,
        intermediate_size=65536,
        num_hidden_layers=64,
        vocab_size=320,
        head_dim=128,
        num_attention_heads=64,
        num_key_value_heads=8,
    )
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps(cfg_json))
    d = edited_drafter(k.steps[-1], tmp_path / "d", hidden_size=8192, target_layer_ids=[1, 2])
    # no safetensors header to read the fc width from: only the memory check can refuse
    os.remove(os.path.join(d, "model.safetensors"))
    torch.save({}, os.path.join(d, "model.pt"))
    gt = write_gt(k.rows[:1], tmp_path / "gt.jsonl")
    events = []
    with pytest.raises(UserError, match="GiB is available"):
        run_eval(
            spec_of(
                {
                    "target": str(tmp_path / "t"),
                    "drafter": d,
                    "ground_truth": gt,
                    "output_dir": str(tmp_path / "o"),
                },
                tmp_path,
            ),
            on_event=events.append,
        )
    assert events == []


def test_memory_counts_the_widening_buffer(monkeypatch):
    """Where bf16 products run in float32, the engine's estimate and the preflight count
    the same buffer the weights are widened into (the largest weight, the head here, a
    slice at most), and the buffer a head-sized product really keeps is within it."""
    from types import SimpleNamespace

    from remote.eval import cpu_bf16
    from remote.eval.drafter import read_config
    from remote.eval.memory import estimate_bytes, widening_bytes
    from remote.eval.preflight import _widening

    drafter = kit("qwen3").steps[-1]
    cfg = read_config(drafter)
    head = cfg.vocab_size * cfg.hidden_size
    assert head > cfg.hidden_size * max(cfg.intermediate_size, 4 * cfg.hidden_size)
    plain = estimate_bytes(10**6, cfg, 100, 2, 64)
    assert estimate_bytes(10**6, cfg, 100, 2, 64, widens=True) - plain == 4 * head
    assert widening_bytes(5120, 248320) == 4 * cpu_bf16.SLICE_ELEMENTS  # a 27B head's slice
    wide = SimpleNamespace(hidden_size=64, intermediate_size=4096, target_layer_ids=[1])
    assert widening_bytes(64, 512, wide) == 4 * 64 * 4096  # an MLP wider than the head
    cpu_bf16._scratch.buf = None
    w = torch.randn(cfg.vocab_size, cfg.hidden_size).bfloat16()
    with torch.inference_mode(), cpu_bf16.widened("float32"):
        torch.nn.functional.linear(torch.randn(5, cfg.hidden_size).bfloat16(), w)
    assert 0 < cpu_bf16._scratch.buf.numel() * 4 <= widening_bytes(cfg.hidden_size, cfg.vocab_size)
    layout = SimpleNamespace(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size)
    for policy, dtype, device, widened in (
        ("float32", "bfloat16", "cpu", True),
        ("native", "bfloat16", "cpu", False),
        ("float32", "float32", "cpu", False),
        ("float32", "bfloat16", "cuda", False),
    ):
        monkeypatch.setenv(cpu_bf16.ENV, policy)
        spec = EvalSpec(target="/t", dtype=dtype, device=device)
        for folder in (None, drafter):
            got = _widening(spec, layout, folder)
            assert got == (4 * head if widened else 0), (policy, dtype, device, folder)


def test_spec_errors(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(
        json.dumps(
            {"target": "t", "drafter": "d", "ground_truth": "g", "output_dir": "o", "dtype": "fp16"}
        )
    )
    with pytest.raises(UserError, match="dtype"):
        read_spec(str(p))
    p.write_text(
        json.dumps(
            {"target": "t", "drafter": "d", "ground_truth": "g", "output_dir": "o", "budgets": [0]}
        )
    )
    with pytest.raises(UserError, match="budgets"):
        read_spec(str(p))
    p.write_text(
        json.dumps({"target": "t", "drafter": "d", "ground_truth": "g", "output_dir": "o"})
    )
    spec = read_spec(str(p))
    assert spec.dtype == "bfloat16" and spec.budgets == () and spec.block_chunk is None


def test_bf16_default_runs_in_process_and_reports_agreement(tmp_path):
    k = kit("qwen35")
    gt = write_gt(k.rows[:2], tmp_path / "gt.jsonl")
    events = []
    result = run_eval(
        spec_of(
            {
                "target": k.target,
                "drafter": k.steps[-1],
                "ground_truth": gt,
                "output_dir": str(tmp_path / "o"),
                "budgets": [8],
                "topk": 2,
            },
            tmp_path,
        ),
        on_event=events.append,
    )
    assert result["inputs"]["dtype"] == "bfloat16" and result["environment"]["fla"] is None
    assert result["inputs"]["target_architecture"] == "Qwen3_5ForConditionalGeneration"
    assert result["metrics"]["ddtree"]["8"]["topk"] == 2
    agreement = result["metrics"]["target_agreement"]
    assert agreement["total"] == sum(len(r["completion_ids"]) for r in k.rows[:2])
    assert 0.5 <= agreement["rate"] <= 1.0  # bf16 may flip the odd near-tie, not most tokens
    assert events[0]["event"] == "start" and events[-1]["event"] == "done"


def test_bf16_rounds_do_not_depend_on_how_the_cpu_multiplies(tmp_path, monkeypatch):
    """On a CPU without bfloat16 kernels the engine widens bfloat16 products to float32
    (`remote.eval.cpu_bf16`); the rounds are torch's own bfloat16 kernels', sample by
    sample, and the result says which way it went."""
    from remote.eval import cpu_bf16

    k = kit("qwen3")
    gt = write_gt(k.rows[:4], tmp_path / "gt.jsonl")
    records = {}
    for chosen in cpu_bf16.POLICIES:
        monkeypatch.setenv(cpu_bf16.ENV, chosen)
        out = tmp_path / chosen
        result = run_eval(
            spec_of(
                {
                    "target": k.target,
                    "drafter": k.steps[-1],
                    "ground_truth": gt,
                    "output_dir": str(out),
                    "budgets": [4, 8],
                },
                tmp_path,
            ),
            on_event=lambda e: None,
        )
        assert result["environment"]["bf16_products"] == chosen
        records[chosen] = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert any(max(r["rounds"]) > 1 for r in records["native"])  # the drafter is accepted
    for a, b in zip(records["native"], records["float32"], strict=True):
        assert (a["rounds"], a["ddtree"]) == (b["rounds"], b["ddtree"]), a["id"]
