"""What the eval benchmarks share: the random-weight targets and drafters they build
(`build`, `build_moe`), random ground truth (`random_seqs`), the walk modes they time
(`MODES`), a fresh child's peak RSS (`peak_rss_of`), the LM head's share of a target's
weights (`head_share`) and the machine's load average as printed (`load_avg`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def build(workdir: str, hidden: int, layers: int, vocab: int) -> tuple[str, str]:
    import torch

    from orchestrator.demo.models import build_qwen3_target
    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab

    target = os.path.join(workdir, "target")
    drafter = os.path.join(workdir, "drafter")
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
    if not os.path.isfile(os.path.join(drafter, "model.safetensors")):
        cfg = json.load(open(os.path.join(target, "config.json")))
        dcfg = {
            k: cfg[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "rms_norm_eps",
                "vocab_size",
                "rope_parameters",
                "max_position_embeddings",
            )
        }
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
    return target, drafter


def build_moe(workdir: str, hidden: int, layers: int, experts: int, vocab: int) -> tuple[str, str]:
    """A random Qwen3.5-MoE VLM target (bf16, saved as users save it: one key per expert)
    and a random 1-layer drafter over its layers 1, n/2, n-2."""
    import torch
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab

    target = os.path.join(workdir, "target")
    drafter = os.path.join(workdir, "drafter")
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
    if not os.path.isfile(os.path.join(drafter, "model.safetensors")):
        text = json.load(open(os.path.join(target, "config.json")))["text_config"]
        dcfg = {
            k: text[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "rms_norm_eps",
                "vocab_size",
                "max_position_embeddings",
            )
        }
        dcfg.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            num_hidden_layers=1,
            block_size=16,
            intermediate_size=hidden * 3,
            num_target_layers=layers,
            dflash_config={"target_layer_ids": [1, layers // 2, layers - 2], "mask_token_id": 3},
        )
        torch.manual_seed(0)
        save_zlab(DFlashDrafter(DrafterConfig.from_dict(dcfg)).to(torch.bfloat16), drafter)
    return target, drafter


HWM_WRAPPER = """
import atexit, runpy, sys
def hwm():
    # VmHWM is per address space: it starts afresh at exec, unlike ru_maxrss, which a forked
    # child inherits from its (large) parent
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            sys.stderr.write('VMHWM ' + line.split()[1] + chr(10))
atexit.register(hwm)
sys.argv = sys.argv[1:]
if sys.argv[0] == '-m':
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
else:
    exec(sys.argv[1])
"""


def peak_rss_of(args: list[str]) -> int:
    """Peak RSS bytes of a fresh Python child running ``-m module args...`` or ``-c code``."""
    proc = subprocess.run(
        [sys.executable, "-c", HWM_WRAPPER, *args],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if proc.returncode:
        raise SystemExit(f"child {args} failed: {proc.stderr[-2000:]}")
    kib = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("VMHWM ")]
    return kib[-1] * 1024


MODES = {  # label -> WalkOptions arguments
    "all": {"positions": "all"},
    "all+DDTree": {"budgets": [8, 16, 32, 64], "positions": "all"},
    "walk": {"positions": "walk"},
}


def random_seqs(vocab: int, samples: int, prompt: int, completion: int, seed: int = 0):
    """(prompts, prompt + completion sequences) of random tokens: a random drafter accepts
    nothing on them, as on the target's own greedy output."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(prompt)] for _ in range(samples)]
    return prompts, [p + [rng.randrange(10, vocab) for _ in range(completion)] for p in prompts]


def head_share(target_dir: str) -> float:
    """The LM head's share of the target's text weights (embedding and head included)."""
    import torch

    from remote.eval.target import describe, text_weight_bytes

    _c, meta, info = describe(target_dir)
    head = meta.get_submodule(info.head_path).weight.numel() * 2
    return head / text_weight_bytes(meta, info, torch.bfloat16)


def load_avg() -> str:
    """The 1, 5 and 15-minute load averages, as a benchmark prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
