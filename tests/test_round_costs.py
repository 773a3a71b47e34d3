"""The round costs an eval host measures for the speedup estimate (`remote.eval.costs`):
a DDTree verify is one target forward over the tree's tokens under a tree attention mask
that gives each node exactly what a causal forward over its own path gives, and every
target kind is timed, those whose KV cache cannot be cropped back included. Within a
budget (`remote.eval.round_timing`) the chain's parts are timed twice at least and the
rest read off them; the eval's costs reuse the walk's forward over their sample."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from orchestrator.demo.architectures import Dims, save_tiny
from remote.eval import costs, round_timing
from remote.eval.drafter import load_drafter
from remote.eval.target import cache_kwarg, load_target
from tests.helpers.drafters import build_drafter

torch.set_num_threads(1)

# window 8 < the context: a sliding layer's cache keeps only part of it
DIMS = Dims(hidden=64, layers=4, vocab=160, max_positions=256, window=8)
CONTEXT = list(range(5, 25))
# (parent index, depth, token): a root with two children, a grandchild under each, and a
# third-level node under the second's (indices in the order `build_tree` pops them)
NODES = [(-1, 1, 40), (-1, 1, 41), (0, 2, 42), (1, 2, 43), (3, 3, 44)]


@pytest.fixture(scope="module", params=["qwen3", "gemma3_text", "qwen3_5"])
def model(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    path = save_tiny(request.param, Path(tmp) / "target", DIMS)
    return request.param, load_target(str(path), torch.float32)


# qwen3_5's linear-attention layers take no mask: a tree runs there as a sequence (timed,
# not exact), so only the attention-only kinds are held to each node's own path.
@pytest.mark.parametrize("model", ["qwen3", "gemma3_text"], indirect=True)
def test_a_tree_verify_gives_each_node_its_own_paths_forward(model):
    name, target = model
    from transformers import DynamicCache

    key = cache_kwarg(target.backbone)
    cache = DynamicCache(config=target.model.config)
    with torch.inference_mode():
        target.backbone(input_ids=torch.tensor([CONTEXT[:-1]]), **{key: cache}, use_cache=True)
        base, root = len(CONTEXT) - 1, CONTEXT[-1]
        tokens, positions, allowed = costs.tree_inputs(NODES, root, base)
        assert positions == [base, base + 1, base + 1, base + 2, base + 2, base + 3]
        mask = costs.tree_mask(target, cache, allowed, positions, torch.float32)
        tree = target.backbone(
            input_ids=torch.tensor([tokens]),
            **{key: copy.deepcopy(cache)},
            use_cache=True,
            attention_mask=mask,
            position_ids=torch.tensor([positions]),
        ).last_hidden_state[0]
        for i in range(len(tokens)):  # the root is row 0, node k row k + 1
            path, j = [], i
            while j > 0:
                path.append(NODES[j - 1][2])
                j = NODES[j - 1][0] + 1
            _, causal = target.hidden(CONTEXT + path[::-1], [0])
            torch.testing.assert_close(tree[i], causal[-1], rtol=1e-4, atol=1e-4)


def test_every_target_kind_gets_its_round_costs_and_tree_verifies(model, tmp_path):
    name, target = model
    drafter_dir = build_drafter(
        tmp_path / "d", [1, 2], hidden=64, vocab=160, block_size=6, mask_token_id=150
    )
    drafter, _ = load_drafter(str(drafter_dir), torch.float32, DIMS.layers)
    rows = [{"prompt_ids": CONTEXT, "completion_ids": list(range(30, 50))}]
    inputs = costs.CostInputs.of(rows, drafter.block_size, [2, 5], topk=3)
    got = costs.measure(target, drafter, inputs, torch.device("cpu"))
    assert "error" not in got and "tree_verify_error" not in got, got
    assert set(got["target_verify_s"]) == {"6", "3"} and set(got["tree_verify_s"]) == {"2", "5"}
    assert all(v > 0 for v in [got["target_step_s"], got["drafter_round_s"]])
    assert all(v > 0 for v in got["tree_verify_s"].values())


def test_a_spent_budget_times_the_chain_once_and_reads_the_rest_off_it(model, tmp_path):
    name, target = model
    drafter_dir = build_drafter(
        tmp_path / "d", [1, 2], hidden=64, vocab=160, block_size=6, mask_token_id=150
    )
    drafter, _ = load_drafter(str(drafter_dir), torch.float32, DIMS.layers)
    rows = [{"prompt_ids": CONTEXT, "completion_ids": list(range(30, 50))}]
    inputs = costs.CostInputs.of(rows, drafter.block_size, [2, 5, 12], topk=3)
    calls = []
    hook = target.backbone.register_forward_pre_hook(lambda *_a, **_k: calls.append(1))
    try:
        got = costs.measure(target, drafter, inputs, torch.device("cpu"), budget_s=0.0)
    finally:
        hook.remove()
    assert "error" not in got, got
    # the step and the chain's verify, once each (a second trial would pass the budget),
    # after the context's own forwards: each spread is its one time
    assert len(calls) == 2 + 2
    assert set(got["spread"]) == {"drafter_round_s", "target_step_s", "target_verify_s/6"}
    assert got["spread"]["target_step_s"] == [got["target_step_s"]]
    assert all(len(times) == 1 for times in got["spread"].values())
    verify = got["target_verify_s"]
    assert set(verify) == {"6", "3", "13"} and not got.get("tree_verify_s")
    points = {1: got["target_step_s"], 6: verify["6"]}
    assert verify["3"] == pytest.approx(round_timing.interpolate(points, 3))
    # no budget: every part, the trees too, each the fastest of REPEATS after a warm-up
    got = costs.measure(target, drafter, inputs, torch.device("cpu"))
    assert set(got["tree_verify_s"]) == {"2", "5", "12"}
    assert {"target_verify_s/3", "target_verify_s/13", "tree_verify_s/12"} <= set(got["spread"])
    assert all(len(times) == 2 and times[0] <= times[1] for times in got["spread"].values())


def test_interpolation_is_linear_between_and_beyond_the_timed_sizes():
    points = {1: 1.0, 16: 2.5, 384: 39.3}
    assert round_timing.interpolate(points, 16) == 2.5
    assert round_timing.interpolate(points, 6) == pytest.approx(1.5)
    assert round_timing.interpolate(points, 200) == pytest.approx(2.5 + 184 * 0.1)
    assert round_timing.interpolate({1: 1.0, 16: 2.5}, 31) == pytest.approx(4.0)


def test_the_evals_costs_reuse_the_walks_forward_over_their_sample(model, tmp_path):
    import json

    from remote.eval.engine import run_eval
    from remote.protocol import EvalSpec

    name, target = model
    drafter_dir = build_drafter(
        tmp_path / "d", [1, 2], hidden=64, vocab=160, block_size=6, mask_token_id=150
    )
    rows = [
        {"id": i, "prompt_ids": CONTEXT[i:], "completion_ids": list(range(30 + i, 50))}
        for i in range(3)
    ]
    gt = tmp_path / "gt.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = EvalSpec.from_json(
        {
            "target": str(tmp_path),  # loaded already: only its folder is checked
            "drafter": str(drafter_dir),
            "ground_truth": str(gt),
            "output_dir": str(tmp_path / "out"),
            "dtype": "float32",
            "budgets": [2, 5],
        }
    )
    lengths = []
    hook = target.backbone.register_forward_pre_hook(
        lambda _m, _a, kw: lengths.append(kw["input_ids"].shape[-1]), with_kwargs=True
    )
    try:
        result = run_eval(spec, on_event=lambda _e: None, target=target)
    finally:
        hook.remove()
    timings = result["timings"]
    assert "error" not in timings["round_costs"], timings["round_costs"]
    totals = sorted(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    assert timings["round_costs"]["context_tokens"] == totals[1]  # the median sample, whole
    assert 0 < timings["round_costs_s"] < timings["total_s"]
    # one forward per sample over it, the walk's; the costs' own are a round's few tokens
    assert sorted(n for n in lengths if n > 16) == totals
