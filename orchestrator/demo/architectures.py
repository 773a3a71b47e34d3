"""Tiny random-weight models of real transformers architectures (their real config
classes, no download): the one place a tiny model's shape is written (docs/probe.md).

torch and transformers are imported when a model is built, never at import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Dims:
    """The sizes of a tiny text stack; the rest of a model is derived from them."""

    hidden: int = 32
    layers: int | None = None
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None
    intermediate: int | None = None
    vocab: int = 160
    max_positions: int = 256
    window: int = 16

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def mlp(self) -> int:
        return self.intermediate or 2 * self.hidden

    def text(self, **extra: Any) -> dict[str, Any]:
        """The text config's shared keyword arguments, updated with `extra`."""
        shared = dict(
            hidden_size=self.hidden,
            intermediate_size=self.mlp,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.dim,
            vocab_size=self.vocab,
            max_position_embeddings=self.max_positions,
        )
        return {**shared, **extra}

    def moe(self) -> dict[str, Any]:
        return dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=self.mlp // 4)

    def linear_attention(self) -> dict[str, Any]:
        """Gated DeltaNet heads (Qwen3.5, Qwen3-Next) and their layer pattern."""
        return dict(
            linear_conv_kernel_dim=4,
            linear_key_head_dim=self.dim,
            linear_value_head_dim=self.dim,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            layer_types=pattern(self.layers, "linear_attention", every=4),
        )

    def sliding(self, every: int) -> dict[str, Any]:
        """Sliding-window layers; every `every`-th, and at least the last, full attention."""
        return dict(
            sliding_window=self.window,
            layer_types=pattern(self.layers, "sliding_attention", every=min(every, self.layers)),
        )

    def mrope(self, **extra: Any) -> dict[str, Any]:
        """Qwen-VL's multimodal RoPE: the rotary half split into time, height, width."""
        half, eighth = self.dim // 2, self.dim // 8
        sections = [half - 2 * eighth, eighth, eighth]
        return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections, **extra}

    def image_token(self) -> int:
        return self.vocab - 1  # no prompt here uses the top of the vocabulary


def pattern(layers: int, local: str, every: int) -> list[str]:
    """`layers` layer types: `local`, with every `every`-th layer full attention."""
    return ["full_attention" if (i + 1) % every == 0 else local for i in range(layers)]


def small_vision(**extra: Any) -> dict[str, Any]:
    """A one-layer ViT config (CLIP, SigLIP, Pixtral, Idefics3, Llama4 names)."""
    vit = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
    )
    return {**vit, **extra}


def qwen_vision(d: Dims, depth: int = 1, **extra: Any) -> dict[str, Any]:
    """A Qwen-VL vision tower config whose merger feeds the text stack's width."""
    return dict(
        depth=depth,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        out_hidden_size=d.hidden,
        **extra,
    )


def _qwen3_vl_vision(d: Dims) -> dict[str, Any]:
    return qwen_vision(d, depth=2, num_position_embeddings=16, deepstack_visual_indexes=[0])


def _qwen3(d: Dims, **over: Any):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**d.text(**over)))


def _llama(d: Dims, **over: Any):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**d.text(**over)))


def _qwen3_moe(d: Dims, **over: Any):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**d.text(**d.moe(), **over)))


def _qwen3_next(d: Dims, **over: Any):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    text = d.text(**d.moe(), **d.linear_attention(), shared_expert_intermediate_size=d.mlp // 4)
    return Qwen3NextForCausalLM(Qwen3NextConfig(**text, **over))


def _qwen3_5(d: Dims, **over: Any):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = d.text(**d.linear_attention(), **over)
    vision = qwen_vision(d, num_position_embeddings=16)
    return Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))


def _qwen3_5_moe(d: Dims, **over: Any):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text = d.text(
        **d.moe(), **d.linear_attention(), shared_expert_intermediate_size=d.mlp // 4, **over
    )
    text.pop("intermediate_size")  # experts only: the dense MLP size is not a field
    vision = qwen_vision(d, num_position_embeddings=16)
    return Qwen3_5MoeForConditionalGeneration(
        Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    )


def _qwen3_vl(d: Dims, **over: Any):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    text = d.text(rope_parameters=d.mrope(mrope_interleaved=True), **over)
    return Qwen3VLForConditionalGeneration(
        Qwen3VLConfig(text_config=text, vision_config=_qwen3_vl_vision(d))
    )


def _qwen3_vl_moe(d: Dims, **over: Any):
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text = d.text(**d.moe(), rope_parameters=d.mrope(mrope_interleaved=True), **over)
    return Qwen3VLMoeForConditionalGeneration(
        Qwen3VLMoeConfig(text_config=text, vision_config=_qwen3_vl_vision(d))
    )


def _qwen2_5_vl(d: Dims, **over: Any):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = d.text(rope_parameters=d.mrope(), **over)
    text.pop("head_dim")  # Qwen2.5-VL derives it from hidden / heads
    vision = qwen_vision(d, fullatt_block_indexes=[0], window_size=8)
    return Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    )


def _llava(d: Dims, **over: Any):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
    from transformers import LlavaForConditionalGeneration as Llava

    cfg = LlavaConfig(
        text_config=LlamaConfig(**d.text(**over)),
        vision_config=CLIPVisionConfig(**small_vision()),
        image_token_index=d.image_token(),
    )
    return Llava(cfg)


def _mistral3(d: Dims, **over: Any):
    from transformers import Mistral3Config, MistralConfig, PixtralVisionConfig
    from transformers import Mistral3ForConditionalGeneration as Mistral3

    cfg = Mistral3Config(
        text_config=MistralConfig(**d.text(**over)),
        vision_config=PixtralVisionConfig(**small_vision(head_dim=16)),
        image_token_index=d.image_token(),
        spatial_merge_size=2,
    )
    return Mistral3(cfg)


def _llama4(d: Dims, **over: Any):
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    text = d.text(
        num_local_experts=4,
        num_experts_per_tok=1,
        intermediate_size_mlp=d.mlp,
        interleave_moe_layer_step=1,
        no_rope_layers=[1] * d.layers,
        attention_chunk_size=64,
        **over,
    )
    vision = small_vision(vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    return Llama4ForConditionalGeneration(
        Llama4Config(text_config=text, vision_config=vision, image_token_index=d.image_token())
    )


def gemma3_text_config(d: Dims, **over: Any):
    """Gemma3's text config (a Gemma checkpoint has no ``lm_head``: the head is tied)."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**d.text(**d.sliding(every=6), **over))


def _gemma3(d: Dims, **over: Any):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    cfg = Gemma3Config(
        text_config=gemma3_text_config(d, **over),
        vision_config=SiglipVisionConfig(**small_vision()),
        mm_tokens_per_image=4,
        image_token_index=d.image_token(),
        boi_token_index=d.vocab - 3,
        eoi_token_index=d.vocab - 2,
    )
    return Gemma3ForConditionalGeneration(cfg)


def _gemma3_text(d: Dims, **over: Any):
    from transformers import Gemma3ForCausalLM

    return Gemma3ForCausalLM(gemma3_text_config(d, **over))


def gemma3n_text_config(d: Dims, **over: Any) -> dict[str, Any]:
    """Gemma3n's text config (per-layer inputs, AltUp, Laurel), as keyword arguments."""
    return d.text(
        **d.sliding(every=5),
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=d.vocab,
        num_kv_shared_layers=0,
        laurel_rank=4,
        altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * d.layers,
        intermediate_size=[d.mlp] * d.layers,
        **over,
    )


def _gemma3n(d: Dims, **over: Any):
    # The text-only class: the full model's vision tower needs timm (docs/probe.md).
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    return Gemma3nForCausalLM(Gemma3nTextConfig(**gemma3n_text_config(d, **over)))


def _paligemma(d: Dims, **over: Any):
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    vision = small_vision(model_type="siglip_vision_model", projection_dim=d.hidden)
    return PaliGemmaForConditionalGeneration(
        PaliGemmaConfig(
            text_config=d.text(model_type="gemma", **over),
            vision_config=vision,
            image_token_index=d.image_token(),
        )
    )


def _idefics(family: str, d: Dims, **over: Any):
    """Idefics3 or SmolVLM (the same layout): `family` names the classes."""
    import transformers

    config = getattr(transformers, f"{family}Config")
    model = getattr(transformers, f"{family}ForConditionalGeneration")
    return model(
        config(
            text_config=d.text(model_type="llama", **over),
            vision_config=small_vision(),
            image_token_id=d.image_token(),
            scale_factor=2,
        )
    )


def _internvl(d: Dims, **over: Any):
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    vision = small_vision(image_size=[16, 16], patch_size=[4, 4])
    return InternVLForConditionalGeneration(
        InternVLConfig(
            text_config=d.text(model_type="qwen2", **over),
            vision_config=vision,
            image_token_id=d.image_token(),
        )
    )


def _gpt_oss(d: Dims, **over: Any):
    from transformers import GptOssConfig, GptOssForCausalLM

    text = d.text(
        **d.sliding(every=2),
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        intermediate_size=d.hidden,  # each expert as wide as the stream
        **over,
    )
    return GptOssForCausalLM(GptOssConfig(**text))


@dataclass(frozen=True)
class Architecture:
    """`build(dims, **config_overrides)` and the default depth of a tiny model."""

    build: Callable[..., Any]
    layers: int


ARCHITECTURES: dict[str, Architecture] = {
    "qwen3": Architecture(_qwen3, 2),
    "llama": Architecture(_llama, 3),
    "qwen3_5": Architecture(_qwen3_5, 4),
    "qwen3_next": Architecture(_qwen3_next, 4),
    "qwen3_vl": Architecture(_qwen3_vl, 2),
    "qwen2_5_vl": Architecture(_qwen2_5_vl, 2),
    "llava": Architecture(_llava, 2),
    "gemma3": Architecture(_gemma3, 3),
    "mistral3": Architecture(_mistral3, 2),
    "qwen3_moe": Architecture(_qwen3_moe, 2),
    "qwen3_5_moe": Architecture(_qwen3_5_moe, 4),
    "qwen3_vl_moe": Architecture(_qwen3_vl_moe, 2),
    "llama4": Architecture(_llama4, 2),
    "gemma3_text": Architecture(_gemma3_text, 3),
    "gemma3n": Architecture(_gemma3n, 2),
    "paligemma": Architecture(_paligemma, 2),
    "idefics3": Architecture(functools.partial(_idefics, "Idefics3"), 2),
    "smolvlm": Architecture(functools.partial(_idefics, "SmolVLM"), 2),
    "internvl": Architecture(_internvl, 2),
    "gpt_oss": Architecture(_gpt_oss, 2),
}


def resolve(name: str, dims: Dims = Dims()) -> Dims:
    """`dims` with the depth filled in from architecture `name` where it says none."""
    return dims if dims.layers else replace(dims, layers=ARCHITECTURES[name].layers)


def tiny_model(name: str, dims: Dims = Dims(), seed: int = 0, **config_overrides: Any):
    """A seeded random-weight model of architecture `name` in eval mode.

    `config_overrides` go into the text config before the weights are made (a pad token
    id zeroes its embedding row)."""
    import torch

    torch.manual_seed(seed)
    return ARCHITECTURES[name].build(resolve(name, dims), **config_overrides).eval()


def save_tiny(
    name: str,
    folder: Path,
    dims: Dims = Dims(),
    seed: int = 0,
    max_shard_size: str | None = None,
) -> Path:
    """Save `tiny_model(name, dims, seed)` under `folder` as ``save_pretrained`` does."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    tiny_model(name, dims, seed).save_pretrained(folder, **kwargs)
    return folder
