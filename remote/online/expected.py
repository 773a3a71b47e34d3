"""Each completion's exact distribution of rounds at the job's sampling, from the target and
drafter loaded as the eval loads them; imports torch, so import it lazily."""

from __future__ import annotations

from typing import Any

import torch

from remote.online.distribution import rounds_pmf
from remote.protocol import EvalSpec


@torch.inference_mode()
def pmfs(target, drafter, rows: list[dict], processing, policy: str) -> dict[Any, list[float]]:
    """`rounds_pmf` of each row's completion, by sample id (`remote.eval.sampled`)."""
    from remote.eval.sampled import acceptance

    layers = drafter.cfg.target_layer_ids
    dtype = drafter.fc.weight.dtype
    out = {}
    for row in rows:
        prompt, ids = row["prompt_ids"], list(row["prompt_ids"]) + list(row["completion_ids"])
        feats, _greedy, final = target.forward(ids, layers, argmax_from=len(prompt) - 1, final=True)
        acc, _ = acceptance(
            target, drafter, ids, len(prompt), feats.to(dtype), final, processing, policy
        )
        out[row["id"]] = rounds_pmf(acc, drafter.block_size)
    return out


def loaded_pair(engine: EvalSpec):
    """(target, drafter, device): the job's pair loaded and placed as the eval loads it,
    for the online job's offline re-walks (`job_pmfs`, `remote.online.simulate`)."""
    from remote.eval import device as device_mod
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    if engine.threads:
        torch.set_num_threads(engine.threads)
    dtype = getattr(torch, engine.dtype)
    device = device_mod.resolve(engine.device)
    target = load_target(engine.target, dtype)
    drafter, _ = load_drafter(engine.drafter, dtype, target.info.num_layers)
    device_mod.place(target, drafter, device)
    return target, drafter, device


def job_pmfs(engine: EvalSpec, rows: list[dict]) -> dict[Any, list[float]]:
    """`pmfs` at the job's temperature, top-k, top-p and draft policy."""
    from remote.eval import device as device_mod
    from remote.eval.logits import Processing

    target, drafter, device = loaded_pair(engine)
    processing = Processing(engine.temperature, engine.top_k, engine.top_p)
    with device_mod.computing(device):
        return pmfs(target, drafter, rows, processing, engine.draft_policy)
