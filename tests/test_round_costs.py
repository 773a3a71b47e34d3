"""The round costs an eval host measures for the speedup estimate (`remote.eval.costs`):
a DDTree verify is one target forward over the tree's tokens under a tree attention mask
that gives each node exactly what a causal forward over its own path gives, and every
target kind is timed, those whose KV cache cannot be cropped back included."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from orchestrator.demo.architectures import Dims, save_tiny
from remote.eval import costs
from remote.eval.drafter import load_drafter
from remote.eval.target import load_target
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

    key = costs._cache_kwarg(target.backbone)
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
