"""A z-lab DFlash drafter's ``config.json``: the fields the forward needs, checked; torch-free."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from remote.errors import UserError
from remote.model.drafter_format import default_target_layer_ids


@dataclass
class DrafterConfig:
    """The fields of a z-lab drafter ``config.json`` the forward needs."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    mask_token_id: int | None
    target_layer_ids: list[int] | None
    num_target_layers: int | None
    layer_types: list[str]
    sliding_window: int | None
    is_causal: bool | None
    attention_bias: bool
    hidden_act: str
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], num_target_layers: int | None = None) -> DrafterConfig:
        """Parse a config dict; ``num_target_layers`` fills the default layer ids if absent."""
        dcfg = d.get("dflash_config") or {}

        def pick(name: str, default: Any = None) -> Any:
            # z-lab reads dflash_config first, then the top level.
            return dcfg.get(name, d.get(name, default))

        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            layers = int(d["num_hidden_layers"])
            cfg = cls(
                hidden_size=hidden,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                intermediate_size=int(d["intermediate_size"]),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                vocab_size=int(d["vocab_size"]),
                block_size=int(pick("block_size", 16)),
                mask_token_id=pick("mask_token_id"),
                target_layer_ids=pick("target_layer_ids"),
                num_target_layers=pick("num_target_layers", num_target_layers),
                layer_types=list(d.get("layer_types") or ["full_attention"] * layers),
                sliding_window=d.get("sliding_window"),
                is_causal=d.get("is_causal"),
                attention_bias=bool(d.get("attention_bias", False)),
                hidden_act=str(d.get("hidden_act", "silu")),
                input_embedding_scale=float(pick("input_embedding_scale", 1.0)),
                output_multiplier=float(pick("output_multiplier", 1.0)),
                final_logit_softcapping=pick("final_logit_softcapping"),
                raw=d,
            )
        except KeyError as exc:
            raise UserError(
                f"drafter config.json lacks {exc.args[0]!r}; is this a DFlash drafter config?"
            ) from None
        if num_target_layers is not None:
            cfg.num_target_layers = (
                int(num_target_layers) if cfg.num_target_layers is None else cfg.num_target_layers
            )
        if cfg.target_layer_ids is None:
            if cfg.num_target_layers is None:
                raise UserError(
                    "drafter config has no target_layer_ids "
                    "and no num_target_layers; add one of them"
                )
            cfg.target_layer_ids = default_target_layer_ids(
                int(cfg.num_target_layers), cfg.num_layers
            )
        cfg.target_layer_ids = [int(i) for i in cfg.target_layer_ids]
        if cfg.mask_token_id is None:
            raise UserError(
                "drafter config has no dflash_config.mask_token_id; "
                "add the mask token id used in training"
            )
        cfg.mask_token_id = int(cfg.mask_token_id)
        if len(cfg.layer_types) != layers:
            raise UserError(
                f"drafter config layer_types has {len(cfg.layer_types)} entries for {layers} layers"
            )
        if heads % cfg.num_kv_heads:
            raise UserError(
                f"drafter num_attention_heads {heads} is not a "
                f"multiple of num_key_value_heads {cfg.num_kv_heads}"
            )
        return cfg

    def layer_attention(self, i: int) -> tuple[bool, int | None]:
        """(is_causal, sliding_window) of drafter layer ``i``, following z-lab's rule."""
        sliding = self.layer_types[i] == "sliding_attention"
        causal = sliding if self.is_causal is None else bool(self.is_causal)
        return causal, (int(self.sliding_window) if sliding and self.sliding_window else None)


def read_config(path: str, num_target_layers: int | None = None) -> DrafterConfig:
    """Read the drafter's ``config.json`` (``path`` is the checkpoint folder or a weights file)."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise UserError(
            f"no config.json beside the drafter weights in {folder}; copy the training config there"
        )
    with open(cfg_path) as fh:
        return DrafterConfig.from_dict(json.load(fh), num_target_layers)
