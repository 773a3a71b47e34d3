"""Train a tiny DFlash drafter for real, on CPU, on a target's own greedy outputs.

It learns each block's tokens from the target's features through the inference forward
(`DFlashDrafter.forward_blocks`), the target's embedding and head frozen; checkpoints are
z-lab format.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any


def greedy_complete(target, prompt: list[int], new_tokens: int) -> list[int]:
    """The target's greedy continuation of ``prompt`` (the whole prefix each step: exact for
    any architecture, fine for tiny models)."""
    g = list(prompt)
    for _ in range(new_tokens):
        _f, arg = target.forward(g, [0], argmax_from=len(g) - 1)
        g.append(int(arg[-1]))
    return g[len(prompt) :]


def make_ground_truth(
    target_dir: str,
    n: int,
    *,
    prompt_len: int = 12,
    completion_len: int = 40,
    seed: int = 0,
    path: str | None = None,
) -> list[dict[str, Any]]:
    """``n`` ground-truth samples: the target's greedy completions of random-token prompts
    (written as JSONL when ``path``)."""
    import torch

    from remote.eval.target import load_target

    target = load_target(target_dir, torch.float32)
    vocab = target.info.vocab_size
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = [rng.randrange(8, vocab) for _ in range(prompt_len)]
        rows.append(
            {
                "id": f"s{i}",
                "prompt_ids": prompt,
                "completion_ids": greedy_complete(target, prompt, completion_len),
            }
        )
    if path:
        with open(path, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
    return rows


def drafter_config(
    target_info,
    *,
    mask_token_id: int,
    block_size: int,
    num_layers: int,
    target_layer_ids: list[int],
    intermediate_size: int | None = None,
    head_dim: int = 16,
    max_positions: int = 4096,
) -> dict[str, Any]:
    """A z-lab drafter config.json sized to the target (vLLM's CPU attention: docs/online.md)."""
    h = target_info.hidden_size
    heads = max(1, h // head_dim)
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": h,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "head_dim": h // heads,
        "intermediate_size": intermediate_size or 2 * h,
        "rms_norm_eps": 1e-6,
        "vocab_size": target_info.vocab_size,
        "rope_theta": 1000000.0,
        "max_position_embeddings": max_positions,
        "hidden_act": "silu",
        "attention_bias": False,
        "block_size": block_size,
        "num_target_layers": target_info.num_layers,
        "dflash_config": {"target_layer_ids": target_layer_ids, "mask_token_id": mask_token_id},
    }


def train_drafter(
    target_dir: str,
    out_dir: str,
    *,
    save_steps: tuple[int, ...] = (0, 40, 150),
    block_size: int = 4,
    num_layers: int = 1,
    target_layer_ids: list[int] | None = None,
    samples: int = 24,
    prompt_len: int = 12,
    completion_len: int = 40,
    blocks_per_sample: int = 16,
    batch_samples: int = 4,
    lr: float = 3e-3,
    seed: int = 0,
    rows: list[dict[str, Any]] | None = None,
    head_dim: int = 16,
    intermediate_size: int | None = None,
    until: Callable[[str], bool] | None = None,
) -> list[str]:
    """Train and save ``out_dir/step-{N}`` for each N in ``save_steps``; returns their paths.

    The default layers leave the target's final-normed last layer out; ``rows`` replace
    freshly made samples; training stops at the first checkpoint ``until`` accepts."""
    import torch
    import torch.nn.functional as F

    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab
    from remote.eval.target import load_target

    torch.manual_seed(seed)
    target = load_target(target_dir, torch.float32)
    info = target.info
    layer_ids = target_layer_ids or sorted({1, max(1, info.num_layers - 2)})
    mask_id = _mask_token_id(target_dir, info.vocab_size)
    cfg = DrafterConfig.from_dict(
        drafter_config(
            info,
            mask_token_id=mask_id,
            block_size=block_size,
            num_layers=num_layers,
            target_layer_ids=layer_ids,
            head_dim=head_dim,
            intermediate_size=intermediate_size,
            max_positions=_window(target_dir),
        )
    )
    if rows is None:
        rows = make_ground_truth(
            target_dir, samples, prompt_len=prompt_len, completion_len=completion_len, seed=seed + 1
        )
    data = []
    for r in rows:
        g = r["prompt_ids"] + r["completion_ids"]
        feats, _ = target.forward(g, layer_ids)
        data.append((feats.clone(), torch.tensor(g), len(r["prompt_ids"])))
    model = DFlashDrafter(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    embed, head = target.embed.detach(), target.lm_head.detach()
    rng = random.Random(seed)
    paths, last = [], max(save_steps)
    for step in range(last + 1):
        if step in save_steps:
            path = os.path.join(out_dir, f"step-{step}")
            save_zlab(model, path)
            paths.append(path)
            if until is not None and until(path):
                break
        if step == last:
            break
        loss = 0.0
        for feats, g, P in rng.sample(data, min(batch_samples, len(data))):
            L = len(g) - 1
            starts = torch.tensor(sorted(rng.sample(range(P, L), min(blocks_per_sample, L - P))))
            kv = model.context_kv(feats)
            h = model.forward_blocks(kv, starts, model.block_inputs(embed, g[starts]))
            logits = model.logits(h[:, 1:], head)
            tgt_pos = starts[:, None] + torch.arange(1, block_size)[None, :]
            labels = torch.where(
                tgt_pos <= L, g[tgt_pos.clamp(max=L)], torch.full_like(tgt_pos, -100)
            )
            loss = loss + F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
            )
        opt.zero_grad()
        (loss / min(batch_samples, len(data))).backward()
        opt.step()
    return paths


def _mask_token_id(target_dir: str, vocab: int) -> int:
    """The tokenizer's ``<|mask|>`` id, else the last id."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(target_dir)
        mid = tok.convert_tokens_to_ids("<|mask|>")
        if isinstance(mid, int) and 0 <= mid < vocab and mid != tok.unk_token_id:
            return mid
    except (OSError, ValueError):
        pass
    return vocab - 1


def _window(target_dir: str) -> int:
    """The target's max_position_embeddings (its text config's), as z-lab's drafters copy it."""
    cfg = json.loads(open(os.path.join(target_dir, "config.json")).read())
    return int(cfg.get("text_config", cfg).get("max_position_embeddings") or 4096)
