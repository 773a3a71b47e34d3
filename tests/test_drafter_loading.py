"""Drafter checkpoints in every layout training code writes load to identical logits; bad
checkpoints fail with one clear UserError; the batched forward equals the one-block forward."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.errors import UserError
from remote.eval.drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids, load_drafter
from remote.eval.target import load_target
from tests.helpers.evalkit import kit


@pytest.fixture(scope="module")
def base():
    k = kit("qwen3")
    target = load_target(k.target, torch.float32)
    row = k.rows[0]
    g = row["prompt_ids"] + row["completion_ids"]
    return k.steps[-1], target, g, len(row["prompt_ids"])


def logits_of(path: str, target, g, P, dtype=torch.float32) -> torch.Tensor:
    drafter, _ = load_drafter(path, dtype)
    feats, _ = target.forward(g, drafter.cfg.target_layer_ids)
    kv = drafter.context_kv(feats.to(dtype))
    starts = torch.arange(P, len(g) - 1)
    h = drafter.forward_blocks(
        kv, starts, drafter.block_inputs(target.embed.to(dtype), torch.tensor(g)[starts])
    )
    return drafter.logits(h[:, 1:], target.lm_head.to(dtype)).float()


def copy_config(src: str, dst) -> None:
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))


def test_training_layouts_load_to_identical_logits(base, tmp_path):
    path, target, g, P = base
    ref = logits_of(path, target, g, P)
    state = load_file(os.path.join(path, "model.safetensors"))
    variants = {}
    # 1. wrapper prefixes, stacked as DDP + torch.compile + HF wrapper produce them
    for name, prefix in [
        ("model", "model."),
        ("ddp", "module._orig_mod."),
        ("draft", "draft_model."),
    ]:
        d = tmp_path / name
        copy_config(path, d)
        save_file({prefix + k: v for k, v in state.items()}, str(d / "model.safetensors"))
        variants[name] = str(d)
    # 2. a .pt state dict (nested under "state_dict"), loaded with weights_only=True
    d = tmp_path / "pt"
    copy_config(path, d)
    torch.save(
        {"state_dict": {"module." + k: v for k, v in state.items()}, "step": 150},
        str(d / "drafter.pt"),
    )
    variants["pt"] = str(d / "drafter.pt")
    # 3. sharded safetensors with an index
    d = tmp_path / "sharded"
    copy_config(path, d)
    keys = sorted(state)
    halves = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    weight_map = {}
    for shard, ks in halves.items():
        save_file({k: state[k] for k in ks}, str(d / shard))
        weight_map.update({k: shard for k in ks})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    variants["sharded"] = str(d)
    # 4. a .bin with fp32 masters plus the borrowed head a trainer saved beside them
    d = tmp_path / "bin"
    copy_config(path, d)
    torch.save(
        {**{k: v.float() for k, v in state.items()}, "lm_head.weight": target.lm_head.clone()},
        str(d / "pytorch_model.bin"),
    )
    variants["bin"] = str(d)
    for name, p in variants.items():
        got = logits_of(p, target, g, P)
        assert torch.equal(got, ref), name
    _, report = load_drafter(variants["bin"], torch.float32)
    assert report.ignored_keys == ["lm_head.weight"] and report.source_dtypes == ["float32"]


def test_fp32_master_and_bf16_copy(base, tmp_path):
    path, target, g, P = base
    state = load_file(os.path.join(path, "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in state.values())
    d = tmp_path / "bf16"
    copy_config(path, d)
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(d / "model.safetensors"))
    # fp32 master loaded as bf16 == bf16 copy loaded as bf16 (same rounding, same compute)
    assert torch.equal(
        logits_of(path, target, g, P, torch.bfloat16),
        logits_of(str(d), target, g, P, torch.bfloat16),
    )
    drafter, report = load_drafter(str(d), torch.float32)
    assert report.source_dtypes == ["bfloat16"] and drafter.fc.weight.dtype == torch.float32


def broken(path: str, tmp_path, mutate) -> str:
    d = tmp_path / "broken"
    copy_config(path, d)
    state = load_file(os.path.join(path, "model.safetensors"))
    save_file(mutate(dict(state)), str(d / "model.safetensors"))
    return str(d)


def test_bad_checkpoints_fail_with_a_named_key(base, tmp_path):
    path = base[0]

    def extra(s):
        s["layers.0.self_attn.rotary_fancy.weight"] = torch.zeros(2)
        return s

    with pytest.raises(UserError, match=r"layers\.0\.self_attn\.rotary_fancy\.weight"):
        load_drafter(broken(path, tmp_path / "a", extra))

    def missing(s):
        del s["layers.0.mlp.up_proj.weight"]
        return s

    with pytest.raises(UserError, match=r"lack layers\.0\.mlp\.up_proj\.weight"):
        load_drafter(broken(path, tmp_path / "b", missing))

    def narrow_fc(s):
        s["fc.weight"] = s["fc.weight"][:, : s["fc.weight"].shape[1] // 2].contiguous()
        return s

    with pytest.raises(UserError, match="fc takes 64 features"):
        load_drafter(broken(path, tmp_path / "c", narrow_fc))


class Payload:
    """An arbitrary object: unpickling it would run code, so weights_only must refuse it."""


def test_pickled_objects_are_refused(base, tmp_path):
    d = tmp_path / "pickle"
    copy_config(base[0], d)
    torch.save({"fc.weight": torch.zeros(2), "hook": Payload()}, str(d / "drafter.pt"))
    with pytest.raises(UserError, match="not a weights-only state dict"):
        load_drafter(str(d / "drafter.pt"))
    torch.save({"fc.weight": torch.zeros(2), "note": "text"}, str(d / "drafter.pt"))
    with pytest.raises(UserError, match="flat state dict of tensors"):
        load_drafter(str(d / "drafter.pt"))


def test_default_layer_ids_and_missing_mask():
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert default_target_layer_ids(36, 1) == [18]
    base = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 320,
        "num_target_layers": 64,
        "dflash_config": {"mask_token_id": 3},
    }
    assert DrafterConfig.from_dict(base).target_layer_ids == [1, 61]
    with pytest.raises(UserError, match="mask_token_id"):
        DrafterConfig.from_dict({**base, "dflash_config": {}})


@pytest.mark.parametrize(
    "layer_types,window,rope",
    [
        (["full_attention", "full_attention"], None, {"rope_theta": 10000.0}),
        (
            ["sliding_attention", "full_attention"],
            5,
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}},
        ),
        (
            ["sliding_attention", "sliding_attention"],
            3,
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "rope_theta": 1e6,
                    "original_max_position_embeddings": 64,
                }
            },
        ),
    ],
)
def test_batched_blocks_equal_single_block_forward(layer_types, window, rope):
    torch.manual_seed(0)
    cfg = DrafterConfig.from_dict(
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 64,
            "vocab_size": 50,
            "block_size": 4,
            "layer_types": layer_types,
            "sliding_window": window,
            "max_position_embeddings": 256,
            **rope,
            "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": 49},
        }
    )
    model = DFlashDrafter(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # norms away from 1, so q/k norms matter
        feats = torch.randn(20, 64)
        embed = torch.randn(50, 32)
        starts = torch.tensor([3, 4, 9, 15, 16])
        blocks = model.block_inputs(embed, torch.tensor([5, 6, 7, 8, 9]))
        batched = model.forward_blocks(model.context_kv(feats), starts, blocks)
        for b, s in enumerate(starts.tolist()):
            single = model.forward_block(feats[:s], blocks[b], s)
            torch.testing.assert_close(batched[b], single, rtol=1e-5, atol=1e-5)
        # the sliding window really restricts attention: a far context change is invisible
        if window and all(t == "sliding_attention" for t in layer_types):
            far = feats.clone()
            far[0] += 5.0
            again = model.forward_blocks(model.context_kv(far), starts[-1:], blocks[-1:])
            torch.testing.assert_close(again, batched[-1:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "layers,layer_types,window",
    [
        (1, ["full_attention"], None),
        (2, ["full_attention", "full_attention"], None),
        (3, ["sliding_attention", "full_attention", "sliding_attention"], 3),
    ],
)
def test_lazy_rows_equal_the_full_forward(layers, layer_types, window):
    """The eval asks `Blocks.hidden` for a few rows and `Blocks.depths` for windows of them
    (mask rows projected once in layer 0, last layer per row): those rows equal the plain
    forward of whole blocks."""
    torch.manual_seed(1)
    cfg = DrafterConfig.from_dict(
        {
            "hidden_size": 32,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 64,
            "vocab_size": 50,
            "block_size": 5,
            "layer_types": layer_types,
            "sliding_window": window,
            "max_position_embeddings": 256,
            "rope_theta": 10000.0,
            "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": 49},
        }
    )
    model = DFlashDrafter(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        feats, embed = torch.randn(24, 64), torch.randn(50, 32)
        starts, first = torch.tensor([0, 2, 7, 7, 19]), torch.tensor([5, 6, 7, 1, 9])
        kv = model.context_kv(feats)
        full = torch.stack(
            [
                model.forward_block(feats[:s], model.block_inputs(embed, first[b : b + 1])[0], s)
                for b, s in enumerate(starts.tolist())
            ]
        )
        lazy = model.blocks(kv, starts, first, embed)
        torch.testing.assert_close(lazy.hidden(), full, rtol=1e-5, atol=1e-5)
        rows = torch.tensor([1, 5 + 4, 10 + 2, 15 + 1, 20 + 3, 20 + 0])
        torch.testing.assert_close(
            lazy.hidden(rows), full.reshape(-1, 32)[rows], rtol=1e-5, atol=1e-5
        )
        # a window of depths of some blocks, as the acceptance passes ask for them
        some = torch.tensor([4, 1, 3])
        torch.testing.assert_close(lazy.depths(some, 2, 3), full[some, 2:5], rtol=1e-5, atol=1e-5)
