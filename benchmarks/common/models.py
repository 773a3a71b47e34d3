"""Random-weight models for the eval benchmarks, built once under a work folder and reused:
a Qwen3 target (`build`) or a Qwen3.5-MoE VLM target (`build_moe`), each with a random
1-layer block-16 z-lab drafter over its layers 1, n/2 and n-2; random ground truth
(`random_seqs`); the walk modes the engine is timed in (`MODES`); the target's weight bytes
and its LM head's share of them; Qwen3.6-27B's published config (`QWEN36_27B`)."""

from __future__ import annotations

import json
import os

MODES = {  # label -> WalkOptions arguments
    "all": {"positions": "all"},
    "all+DDTree": {"budgets": [8, 16, 32, 64], "positions": "all"},
    "walk": {"positions": "walk"},
}

# Qwen3.6-27B's config.json as published (https://huggingface.co/Qwen/Qwen3.6-27B,
# config.json; the text part as in THUDM/slime's scripts/models/qwen3.5-27B.sh): the
# probe's 27B config (memory.py) and the real-width target's (common.realwidth).
QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "dtype": "bfloat16",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "dtype": "bfloat16",
    },
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 5120,
        "num_position_embeddings": 2304,
    },
}

# what a 1-layer drafter takes from its target's text config
DRAFTER_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
)


def build(workdir: str, hidden: int, layers: int, vocab: int) -> tuple[str, str]:
    """(target, drafter) folders under ``workdir``, named by shape: a bf16 Qwen3 of
    ``layers`` x ``hidden``, heads of 128."""
    from orchestrator.demo.models import build_qwen3_target

    workdir = os.path.join(workdir, f"qwen3-{layers}x{hidden}v{vocab}")
    target = os.path.join(workdir, "target")
    if not os.path.isfile(os.path.join(target, "model.safetensors")):
        build_qwen3_target(
            target,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=hidden // 128,
            num_kv_heads=max(1, hidden // 512),
            intermediate_size=int(hidden * 8 / 3) // 64 * 64,
            model_vocab_size=vocab,
            dtype="bfloat16",
        )
    cfg = json.load(open(os.path.join(target, "config.json")))
    more = {k: cfg[k] for k in ("intermediate_size", "rope_parameters")}
    return target, _drafter(workdir, cfg, layers, more)


def build_moe(workdir: str, hidden: int, layers: int, experts: int, vocab: int) -> tuple[str, str]:
    """(target, drafter) folders under ``workdir``, named by shape: a bf16 Qwen3.5-MoE VLM
    target saved as users save it (one key per expert), with a small vision tower."""
    import torch
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    workdir = os.path.join(workdir, f"moe-{layers}x{hidden}e{experts}v{vocab}")
    target = os.path.join(workdir, "target")
    heads = hidden // 128
    if not os.path.isfile(os.path.join(target, "config.json")):
        text = dict(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 4),
            head_dim=128,
            vocab_size=vocab,
            num_experts=experts,
            num_experts_per_tok=8,
            moe_intermediate_size=hidden // 2,
            shared_expert_intermediate_size=hidden // 2,
            linear_num_key_heads=heads // 2,
            linear_num_value_heads=heads,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        )
        vision = dict(
            depth=2, hidden_size=256, intermediate_size=512, num_heads=4, out_hidden_size=hidden
        )
        cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision)
        torch.manual_seed(0)
        model = Qwen3_5MoeForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(target)
        del model
    text = json.load(open(os.path.join(target, "config.json")))["text_config"]
    return target, _drafter(workdir, text, layers, {"intermediate_size": hidden * 3})


def _drafter(workdir: str, text: dict, layers: int, more: dict) -> str:
    """A random 1-layer block-16 drafter of the target's ``text`` config (and ``more``)."""
    import torch

    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab

    drafter = os.path.join(workdir, "drafter")
    if not os.path.isfile(os.path.join(drafter, "model.safetensors")):
        dcfg = {k: text[k] for k in DRAFTER_KEYS} | more
        dcfg.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            num_hidden_layers=1,
            block_size=16,
            num_target_layers=layers,
            dflash_config={"target_layer_ids": [1, layers // 2, layers - 2], "mask_token_id": 3},
        )
        torch.manual_seed(0)
        save_zlab(DFlashDrafter(DrafterConfig.from_dict(dcfg)).to(torch.bfloat16), drafter)
    return drafter


def random_seqs(vocab: int, samples: int, prompt: int, completion: int, seed: int = 0):
    """(prompts, prompt + completion sequences) of random tokens: a random drafter accepts
    nothing on them, as on the target's own greedy output."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(prompt)] for _ in range(samples)]
    return prompts, [p + [rng.randrange(10, vocab) for _ in range(completion)] for p in prompts]


def weight_bytes(target_dir: str) -> int:
    """The target's text weights in bf16 (embedding and head included)."""
    import torch

    from remote.eval.target import describe, text_weight_bytes

    _c, meta, info = describe(target_dir)
    return text_weight_bytes(meta, info, torch.bfloat16)


def head_share(target_dir: str) -> float:
    """The LM head's share of the target's text weights."""
    from remote.eval.target import describe

    _c, meta, info = describe(target_dir)
    return meta.get_submodule(info.head_path).weight.numel() * 2 / weight_bytes(target_dir)


def eval_rss(target: str, drafter: str, prompts, seqs, threads: int, budgets=()):
    """(peak RSS of a fresh ``python -m remote eval`` over ``seqs``, the fixed runtime's, the
    weights' bytes), DDTree ``budgets`` (none by default). The runtime is what an eval cannot
    do without: python, torch, transformers and the target's modeling code."""
    import tempfile

    import torch

    from remote.eval.drafter import load_drafter

    from .measure import run_child

    with tempfile.TemporaryDirectory(prefix="dflash-bench-rss-") as work:
        gt = os.path.join(work, "gt.jsonl")
        with open(gt, "w") as fh:
            for i, (p, g) in enumerate(zip(prompts, seqs, strict=True)):
                record = {"id": i, "prompt_ids": p, "completion_ids": g[len(p) :]}
                fh.write(json.dumps(record) + "\n")
        spec = os.path.join(work, "job.json")
        with open(spec, "w") as fh:
            json.dump(
                {
                    "target": target,
                    "drafter": drafter,
                    "ground_truth": gt,
                    "output_dir": os.path.join(work, "out"),
                    "threads": threads,
                    "budgets": list(budgets),
                },
                fh,
            )
        runtime = run_child(
            [
                "-c",
                "import remote.eval.engine, remote.eval.walk, remote.eval.drafter; "
                f"from remote.eval.target import describe; describe({target!r})",
            ]
        ).peak
        peak = run_child(["-m", "remote", "eval", "--spec", spec]).peak
    _d, report = load_drafter(drafter, torch.bfloat16)
    return peak, runtime, weight_bytes(target) + report.parameters * 2
