"""Does a DFlash drafter fit a target? Problems, and warnings for what silently ruins
acceptance; RoPE is reported, never compared (docs/probe.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.model.drafter_format import default_target_layer_ids, normalise_key, weight_shapes
from remote.model.files import read_model_config
from remote.model.keys import key_prefix
from remote.model.layout import index_ranges


def rope_summary(cfg: dict) -> dict:
    """rope theta, type and scaling factor, whichever spelling the config uses."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if isinstance(params, dict) and "rope_theta" not in params and params:
        # Per-layer-type rope parameters (Gemma3): compare the full-attention entry.
        params = params.get("full_attention", next(iter(params.values())))
    return {
        "theta": cfg.get(
            "rope_theta", params.get("rope_theta") if isinstance(params, dict) else None
        ),
        "type": (params.get("rope_type") if isinstance(params, dict) else None)
        or scaling.get("rope_type")
        or scaling.get("type")
        or "default",
        "factor": (params.get("factor") if isinstance(params, dict) else None)
        or scaling.get("factor"),
    }


def check_drafter(folder: Path, target: dict, target_text_raw: dict) -> dict:
    """Check a z-lab DFlash drafter against the target; every problem and warning one line.

    `target` carries the probe's ``num_layers``, ``hidden_size``, ``vocab_size``.
    """
    raw = read_model_config(folder, "drafter")
    problems: list[str] = []
    warnings: list[str] = []
    n, hidden, vocab = target["num_layers"], target["hidden_size"], target["vocab_size"]
    d_hidden = raw.get("hidden_size")
    d_layers = raw.get("num_hidden_layers")
    dcfg = raw.get("dflash_config") or {}
    ids = dcfg.get("target_layer_ids", raw.get("target_layer_ids"))
    ids_source = "config"
    if ids is None:
        if not isinstance(d_layers, int):
            problems.append("drafter config has neither target_layer_ids nor num_hidden_layers")
            ids = []
        else:
            ids = default_target_layer_ids(n, d_layers)
            ids_source = "default"
            warnings.append(
                f"no target_layer_ids in the drafter config: z-lab default {ids} assumed"
            )
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        problems.append(f"target_layer_ids must be a list of integers, got {ids!r}")
        ids = []
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        problems.append(f"target_layer_ids {bad} out of range for a {n}-layer target (0..{n - 1})")
    if len(set(ids)) != len(ids):
        problems.append(f"target_layer_ids {ids} repeat a layer")
    ntl = raw.get("num_target_layers")
    if ntl is not None and ntl != n:
        problems.append(f"num_target_layers {ntl} != target's {n} decoder layers")
    if d_hidden != hidden:
        problems.append(
            f"drafter hidden_size {d_hidden} != target hidden_size {hidden} "
            "(the drafter uses the target's embed_tokens and lm_head)"
        )
    d_vocab = raw.get("vocab_size")
    if d_vocab is not None and d_vocab != vocab:
        problems.append(f"drafter vocab_size {d_vocab} != target vocab_size {vocab}")
    mask = dcfg.get("mask_token_id", raw.get("mask_token_id"))
    if mask is None:
        problems.append("no mask_token_id in the drafter's dflash_config")
    elif not isinstance(mask, int) or not 0 <= mask < vocab:
        problems.append(f"mask_token_id {mask!r} is outside the target vocabulary (0..{vocab - 1})")
    block = raw.get("block_size")
    if not isinstance(block, int) or block < 2:
        problems.append(f"block_size must be an integer >= 2, got {block!r}")
    weights: dict[str, Any] = {}
    try:
        keys, shard_problems = weight_shapes(str(folder))
    except UserError as exc:
        problems.append(str(exc))
        keys, shard_problems = {}, []
    stripped = {}
    for k, v in keys.items():
        stripped[normalise_key(k)] = v
    prefixes = sorted({key_prefix(k) for k in keys} - {key_prefix(k) for k in stripped})
    if prefixes:
        warnings.append(
            f"weight keys carry training prefixes ({', '.join(prefixes)}): stripped for this check"
        )
    if keys:
        fc = stripped.get("fc.weight")
        if fc is None:
            problems.append("drafter weights have no fc.weight")
        elif fc[2]:
            out_f, in_f = fc[2][0], fc[2][1]
            weights["fc"] = [out_f, in_f]
            if in_f != len(ids) * hidden:
                problems.append(
                    f"fc input width {in_f} != len(target_layer_ids) {len(ids)} x "
                    f"target hidden {hidden} = {len(ids) * hidden}"
                )
            if out_f != d_hidden:
                problems.append(f"fc output width {out_f} != drafter hidden_size {d_hidden}")
        for name in ("hidden_norm.weight", "norm.weight"):
            if name not in stripped:
                problems.append(f"drafter weights have no {name}")
        layer_ids = sorted(
            {int(m.group(1)) for k in stripped if (m := re.match(r"layers\.(\d+)\.", k))}
        )
        weights["layers"] = len(layer_ids)
        if isinstance(d_layers, int) and layer_ids != list(range(d_layers)):
            problems.append(
                f"drafter weights hold layers {index_ranges(layer_ids) or 'none'}, "
                f"config says num_hidden_layers {d_layers}"
            )
        if any(k.startswith(("embed_tokens", "lm_head")) for k in stripped):
            warnings.append(
                "drafter checkpoint carries its own embed_tokens/lm_head; DFlash uses the target's"
            )
    problems.extend(shard_problems)
    # Settings that run but give different numbers.
    dr, tr = rope_summary(raw), rope_summary(target_text_raw)
    d_max, t_max = (
        raw.get("max_position_embeddings"),
        target_text_raw.get("max_position_embeddings"),
    )
    if isinstance(d_max, int) and isinstance(t_max, int) and d_max < t_max:
        warnings.append(
            f"drafter max_position_embeddings {d_max} < target's {t_max}: "
            "long contexts run past the drafter's trained positions"
        )
    types = raw.get("layer_types") or []
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding:
        window = raw.get("sliding_window")
        how = f"window {window}" if window else "but no sliding_window is set"
        warnings.append(
            f"drafter layers {index_ranges(sliding)} are sliding_attention ({how}): an "
            "eval that ignores sliding windows runs them as full attention"
        )
    if ids and not bad and ids_source == "config" and isinstance(d_layers, int) and d_layers > 0:
        default = default_target_layer_ids(n, len(ids))
        if ids != default and ([i - 1 for i in ids] == default or [i + 1 for i in ids] == default):
            warnings.append(
                f"target_layer_ids {ids} look shifted by one from the default "
                f"{default} (0- vs 1-based, or hidden_states index vs layer index?)"
            )
    if ids and n - 1 in ids:
        warnings.append(
            f"target_layer_ids include the last layer {n - 1}: hidden_states[{n}] "
            "is final-normed in transformers 5.x, take that layer's raw output with a hook"
        )
    if bad and max(bad) == n and min(ids) >= 1:
        warnings.append("target_layer_ids look 1-based (the largest equals the layer count)")
    return {
        "path": str(folder),
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "block_size": block,
        "num_layers": d_layers,
        "hidden_size": d_hidden,
        "vocab_size": d_vocab,
        "mask_token_id": mask,
        "target_layer_ids": ids,
        "target_layer_ids_source": ids_source,
        "hidden_states_indices": [i + 1 for i in ids],
        "weights": weights,
        "rope": dr,
        "target_rope": tr,
    }
