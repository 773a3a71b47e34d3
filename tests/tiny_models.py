"""Tiny random-weight checkpoints built from real transformers config classes.

Each builder returns a model instance; `build_checkpoint` saves it with `save_pretrained`
as a real safetensors checkpoint, exactly as a user's checkpoint would be written (including
transformers' reverse key mapping on save, so a Llava checkpoint stores the legacy
`language_model.model.layers.*` keys). Sizes are tiny (hidden 32, 2-4 layers) so the
whole probe test file runs in seconds on two cores.

`EXPECTED` holds what a correct probe must report for each: layer path (in the class the
checkpoint names), decoder layer count and hidden size. It is test data written by hand from
the transformers source, not something the probe reads.
"""

from __future__ import annotations

import json
from pathlib import Path

HIDDEN = 32
VOCAB = 160
TEXT = dict(
    hidden_size=HIDDEN,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=VOCAB,
    max_position_embeddings=256,
)


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, **TEXT))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, **TEXT))


def _linear_heads() -> dict:
    return dict(
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    )


def _qwen3_5():
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(
        TEXT,
        num_hidden_layers=4,
        **_linear_heads(),
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=HIDDEN,
        num_position_embeddings=16,
    )
    return Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))


def _qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        num_hidden_layers=4,
        **TEXT,
        **_linear_heads(),
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    )
    return Qwen3NextForCausalLM(cfg)


def _qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text = dict(
        TEXT,
        num_hidden_layers=2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=HIDDEN,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    )
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision))


def _qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(
        TEXT,
        num_hidden_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
    )
    text.pop("head_dim")
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=HIDDEN,
        fullatt_block_indexes=[0],
        window_size=8,
    )
    return Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    )


def _clip_vision() -> dict:
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
    )


def _llava():
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    cfg = LlavaConfig(
        text_config=LlamaConfig(num_hidden_layers=2, **TEXT),
        vision_config=CLIPVisionConfig(**_clip_vision()),
        image_token_index=VOCAB - 1,
    )
    return LlavaForConditionalGeneration(cfg)


def _gemma3():
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    text = Gemma3TextConfig(
        num_hidden_layers=3,
        sliding_window=16,
        **TEXT,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    cfg = Gemma3Config(
        text_config=text,
        vision_config=SiglipVisionConfig(**_clip_vision()),
        mm_tokens_per_image=4,
        image_token_index=VOCAB - 1,
        boi_token_index=VOCAB - 3,
        eoi_token_index=VOCAB - 2,
    )
    return Gemma3ForConditionalGeneration(cfg)


def _mistral3():
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralVisionConfig,
    )

    vision = PixtralVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
        head_dim=16,
    )
    cfg = Mistral3Config(
        text_config=MistralConfig(num_hidden_layers=2, **TEXT),
        vision_config=vision,
        image_token_index=VOCAB - 1,
        spatial_merge_size=2,
    )
    return Mistral3ForConditionalGeneration(cfg)


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=2, **TEXT, **MOE))


def _qwen3_5_moe():
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text = dict(
        TEXT,
        num_hidden_layers=4,
        **_linear_heads(),
        **MOE,
        shared_expert_intermediate_size=16,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    )
    text.pop("intermediate_size")
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=HIDDEN,
        num_position_embeddings=16,
    )
    return Qwen3_5MoeForConditionalGeneration(
        Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    )


def _qwen3_vl_moe():
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text = dict(
        TEXT,
        num_hidden_layers=2,
        **MOE,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=HIDDEN,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    )
    return Qwen3VLMoeForConditionalGeneration(
        Qwen3VLMoeConfig(text_config=text, vision_config=vision)
    )


def _llama4():
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    text = dict(
        TEXT,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=1,
        intermediate_size_mlp=64,
        interleave_moe_layer_step=1,
        no_rope_layers=[1, 1],
        attention_chunk_size=64,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
    )
    return Llama4ForConditionalGeneration(
        Llama4Config(text_config=text, vision_config=vision, image_token_index=VOCAB - 1)
    )


def _gemma3_text():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    return Gemma3ForCausalLM(
        Gemma3TextConfig(
            num_hidden_layers=3,
            sliding_window=16,
            **TEXT,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        )
    )


def _gemma3n_text_config() -> dict:
    return dict(
        TEXT,
        num_hidden_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        sliding_window=16,
        num_kv_shared_layers=0,
        layer_types=["sliding_attention", "full_attention"],
        laurel_rank=4,
        altup_num_inputs=2,
        activation_sparsity_pattern=[0.0, 0.0],
        intermediate_size=[64, 64],
    )


def _gemma3n():
    # The text-only class: Gemma3n's full model builds its vision tower with timm, which an
    # eval host need not have (see test_architectures for that case).
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    return Gemma3nForCausalLM(Gemma3nTextConfig(**_gemma3n_text_config()))


def _paligemma():
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    return PaliGemmaForConditionalGeneration(
        PaliGemmaConfig(
            text_config=dict(model_type="gemma", num_hidden_layers=2, **TEXT),
            vision_config=dict(
                model_type="siglip_vision_model", **_clip_vision(), projection_dim=HIDDEN
            ),
            image_token_index=VOCAB - 1,
        )
    )


def _idefics3():
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    return Idefics3ForConditionalGeneration(
        Idefics3Config(
            text_config=dict(model_type="llama", num_hidden_layers=2, **TEXT),
            vision_config=_clip_vision(),
            image_token_id=VOCAB - 1,
            scale_factor=2,
        )
    )


def _smolvlm():
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    return SmolVLMForConditionalGeneration(
        SmolVLMConfig(
            text_config=dict(model_type="llama", num_hidden_layers=2, **TEXT),
            vision_config=_clip_vision(),
            image_token_id=VOCAB - 1,
            scale_factor=2,
        )
    )


def _internvl():
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=[16, 16],
        patch_size=[4, 4],
    )
    return InternVLForConditionalGeneration(
        InternVLConfig(
            text_config=dict(model_type="qwen2", num_hidden_layers=2, **TEXT),
            vision_config=vision,
            image_token_id=VOCAB - 1,
        )
    )


def _gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    text = dict(TEXT, intermediate_size=32)
    return GptOssForCausalLM(
        GptOssConfig(
            num_hidden_layers=2,
            **text,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    )


BUILDERS = {
    "qwen3": _qwen3,
    "llama": _llama,
    "qwen3_5": _qwen3_5,
    "qwen3_next": _qwen3_next,
    "qwen3_vl": _qwen3_vl,
    "qwen2_5_vl": _qwen2_5_vl,
    "llava": _llava,
    "gemma3": _gemma3,
    "mistral3": _mistral3,
}

# name -> (layers path in the checkpoint's class, layer count, hidden size, is a VLM)
EXPECTED = {
    "qwen3": ("model.layers", 2, HIDDEN, False),
    "llama": ("model.layers", 3, HIDDEN, False),
    "qwen3_5": ("model.language_model.layers", 4, HIDDEN, True),
    "qwen3_next": ("model.layers", 4, HIDDEN, False),
    "qwen3_vl": ("model.language_model.layers", 2, HIDDEN, True),
    "qwen2_5_vl": ("model.language_model.layers", 2, HIDDEN, True),
    "llava": ("model.language_model.layers", 2, HIDDEN, True),
    "gemma3": ("model.language_model.layers", 3, HIDDEN, True),
    "mistral3": ("model.language_model.layers", 2, HIDDEN, True),
}


# Every architecture the eval engine covers (tests/test_architectures.py), by name.
ARCHITECTURES = {
    **BUILDERS,
    "qwen3_moe": _qwen3_moe,
    "qwen3_5_moe": _qwen3_5_moe,
    "qwen3_vl_moe": _qwen3_vl_moe,
    "llama4": _llama4,
    "gemma3_text": _gemma3_text,
    "gemma3n": _gemma3n,
    "paligemma": _paligemma,
    "idefics3": _idefics3,
    "smolvlm": _smolvlm,
    "internvl": _internvl,
    "gpt_oss": _gpt_oss,
}


def build_checkpoint(name: str, folder: Path, max_shard_size: str | None = None) -> Path:
    """Build model `name` with seeded random weights and save it under `folder`."""
    import torch

    torch.manual_seed(0)
    model = ARCHITECTURES[name]().eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def build_drafter(
    folder: Path,
    target_layer_ids: list[int],
    hidden: int = HIDDEN,
    vocab: int = VOCAB,
    layers: int = 1,
    fc_width: int | None = None,
    mask_token_id: int = VOCAB - 4,
    block_size: int = 4,
    num_target_layers: int = 4,
    extra_config: dict | None = None,
) -> Path:
    """Write a z-lab format DFlash drafter (config.json + model.safetensors) with random weights."""
    import torch
    from safetensors.torch import save_file

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
