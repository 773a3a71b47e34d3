"""What one round of speculative decoding costs on this host, measured once per eval.

The walk measures acceptance, not speed: its target pass is one teacher-forced forward
over a whole sequence and its drafter batches every position. A serving engine's round is
different: one target forward over the block being verified, on top of a KV cache of the
context, and one drafter call for the next block. `round_costs` times exactly those, on
one sample's context (its prompt and the first half of its completion), with the target
and drafter the eval just used, on the eval's device:

- ``target_step_s``: one target forward of 1 token (an autoregressive decode step);
- ``target_verify_s``: one target forward of n tokens, for n = the block size (the chain)
  and each DDTree budget + 1 (the tree's nodes and its root), keyed by n;
- ``drafter_round_s``: one drafter block (its forward and its head over the block).

Each is the fastest of `REPEATS` after one untimed warm-up (the cache cropped back to the
context after each). The
controller turns them and the run's tau into a speedup estimate (docs/results.md). A
target whose cache cannot be cropped (linear-attention layers) or any other failure is
recorded as ``error`` and the eval goes on: the numbers are an estimate beside tau, never a
reason to lose it.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch

REPEATS = 5


def _cache_kwarg(backbone) -> str:
    """The keyword `backbone.forward` takes its cache by (``cache`` where transformers
    renamed it, else ``past_key_values``)."""
    params = inspect.signature(backbone.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def round_costs(
    target, drafter, ids: list[int], sizes: list[int], device: torch.device
) -> dict[str, Any]:
    """Seconds of a target step, a target verify of each of `sizes` tokens and a drafter
    block, over a KV cache of `ids[:-max(sizes)]` (see the module)."""
    from transformers import DynamicCache

    longest = max(sizes)
    context, tail = ids[:-longest], ids[-longest:]
    backbone, key = target.backbone, _cache_kwarg(target.backbone)
    cache = DynamicCache(config=target.model.config)
    ctx = torch.tensor([context], device=device)
    backbone(input_ids=ctx, **{key: cache}, use_cache=True)
    base = cache.get_seq_length()

    def target_forward(n: int) -> float:
        best = float("inf")
        block = torch.tensor([tail[:n]], device=device)
        for i in range(REPEATS + 1):  # the first one warms up, untimed
            _sync(device)
            t = time.perf_counter()
            out = backbone(input_ids=block, **{key: cache}, use_cache=True)
            target.head(out.last_hidden_state[0]).argmax(-1).tolist()
            _sync(device)
            best = min(best, time.perf_counter() - t) if i else best
            cache.crop(base - cache.get_seq_length())  # transformers 5: a negative count
        return best

    step = target_forward(1)
    verify = {str(n): target_forward(n) for n in sorted(set(sizes))}
    feats, _ = target.hidden(context, drafter.cfg.target_layer_ids)
    kv = drafter.context_kv(feats.to(drafter.fc.weight.dtype))
    first = torch.tensor([tail[0]], device=device)
    best = float("inf")
    for i in range(REPEATS + 1):
        _sync(device)
        t = time.perf_counter()
        block_in = drafter.block_inputs(target.embed, first)
        h = drafter.forward_blocks(kv, torch.tensor([len(context)], device=device), block_in)[0]
        drafter.logits(h[1:], target.lm_head).argmax(-1).tolist()
        _sync(device)
        best = min(best, time.perf_counter() - t) if i else best
    return {
        "context_tokens": len(context),
        "target_step_s": step,
        "target_verify_s": verify,
        "drafter_round_s": best,
        "repeats": REPEATS,
    }


def measure(
    target, drafter, rows: list[dict], budgets: list[int], device: torch.device
) -> dict[str, Any]:
    """`round_costs` on the sample of median length (its prompt and half its completion:
    a typical round's context), for the drafter's block and each DDTree budget; a failure
    is ``{"error": one line}``, never the eval's."""
    try:
        row = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["completion_ids"]))[
            len(rows) // 2
        ]
        sizes = [drafter.block_size, *[b + 1 for b in budgets]]
        half = row["completion_ids"][: max(len(row["completion_ids"]) // 2, 1)]
        ids = list(row["prompt_ids"]) + list(half)
        if len(ids) <= max(sizes):  # too short for a context and a tree: pad the tail
            ids = ids + [ids[-1]] * (max(sizes) + 1 - len(ids))
        return round_costs(target, drafter, ids, sizes, device)
    except Exception as exc:  # an estimate beside tau: never the eval's failure
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return {"error": f"{type(exc).__name__}: {text}"[:300]}
