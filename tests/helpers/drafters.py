"""Tiny z-lab format DFlash drafters with random weights, right or wrong on purpose, for
the probe's drafter checks. (Drafters trained for real come from `orchestrator.demo.train`.)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from orchestrator.demo.architectures import Dims

TINY = Dims()  # the sizes of the tiny targets these drafters are checked against


def build_drafter(
    folder: Path,
    target_layer_ids: list[int],
    hidden: int = TINY.hidden,
    vocab: int = TINY.vocab,
    layers: int = 1,
    fc_width: int | None = None,
    mask_token_id: int = TINY.vocab - 4,
    block_size: int = 4,
    num_target_layers: int = 4,
    extra_config: dict | None = None,
) -> Path:
    """Write a z-lab format DFlash drafter (config.json + model.safetensors) with random
    weights. Every field can be set wrong on purpose (`fc_width`, `mask_token_id`,
    `num_target_layers`, `extra_config`): the probe's drafter checks must name each."""
    folder.mkdir(parents=True, exist_ok=True)
    heads, kv, head_dim, inter = 4, 2, 8, 64
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "vocab_size": vocab,
        "block_size": block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {"target_layer_ids": target_layer_ids, "mask_token_id": mask_token_id},
    }
    config.update(extra_config or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    weights = {
        "fc.weight": r(hidden, fc_width or len(target_layer_ids) * hidden),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
    }
    for i in range(layers):
        p = f"layers.{i}."
        weights.update(
            {
                p + "self_attn.q_proj.weight": r(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": r(kv * head_dim, hidden),
                p + "self_attn.v_proj.weight": r(kv * head_dim, hidden),
                p + "self_attn.o_proj.weight": r(hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": torch.ones(head_dim),
                p + "self_attn.k_norm.weight": torch.ones(head_dim),
                p + "mlp.gate_proj.weight": r(inter, hidden),
                p + "mlp.up_proj.weight": r(inter, hidden),
                p + "mlp.down_proj.weight": r(hidden, inter),
                p + "input_layernorm.weight": torch.ones(hidden),
                p + "post_attention_layernorm.weight": torch.ones(hidden),
            }
        )
    save_file(weights, str(folder / "model.safetensors"))
    return folder
