"""The DDTree rows of `benchmarks/eval.py`: the offline eval with and without the default
DDTree budgets over a bare HF forward of the same sequences, on a head-heavy and a
body-heavy target."""

from __future__ import annotations

import os
import time

from common import build, head_share, random_seqs  # noqa: E402 (benchmarks/ is on the path)

from remote.eval.device import computing
from remote.protocol import DEFAULT_BUDGETS


def ddtree_ratios(target_dir: str, drafter_dir: str, prompts, seqs, repeats: int) -> dict:
    """Seconds of a bare HF forward (full logits) and of the offline eval without and with
    the default DDTree budgets over the same sequences, interleaved, best of ``repeats``."""
    import torch
    from transformers import AutoModelForCausalLM

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    modes = {
        "all": WalkOptions(positions="all"),
        "all+DDTree": WalkOptions(budgets=list(DEFAULT_BUDGETS), positions="all"),
    }
    best = {k: 0.0 for k in ("bare", *modes)}
    with torch.inference_mode(), computing(torch.device("cpu")):
        hf(input_ids=torch.tensor([seqs[0][:32]]))  # warm-up
        eval_sequence(target, drafter, prompts[0][:16], seqs[0][16:40], modes["all+DDTree"])
        for p, g in zip(prompts, seqs, strict=True):
            per = {k: float("inf") for k in best}
            for _ in range(repeats):
                t = time.perf_counter()
                hf(input_ids=torch.tensor([g]))
                per["bare"] = min(per["bare"], time.perf_counter() - t)
                for mode, opts in modes.items():
                    t = time.perf_counter()
                    eval_sequence(target, drafter, p, g[len(p) :], opts)
                    per[mode] = min(per[mode], time.perf_counter() - t)
            for k in best:
                best[k] += per[k]
    return best


def print_ddtree(label: str, target_dir: str, best: dict, goal: float) -> None:
    print(
        f"DDTree [{label}, head {100 * head_share(target_dir):.1f}% of the weights]: "
        f"bare forward {best['bare']:.2f} s; load avg {os.getloadavg()[0]:.2f}"
    )
    print(
        f"  eval [all       ] / bare = {best['all'] / best['bare']:.2f}\n"
        f"  eval [all+DDTree] / bare = {best['all+DDTree'] / best['bare']:.2f}"
        f"   (goal <= {goal}; budgets {','.join(map(str, list(DEFAULT_BUDGETS)))})"
    )


def body_ddtree(args) -> None:
    """The DDTree rows on the body-heavy target (``--body-*``), random ground truth."""
    if not args.body_hidden:
        return
    work = os.path.join(
        args.workdir, f"body-{args.body_hidden}x{args.body_layers}v{args.body_vocab}"
    )
    os.makedirs(work, exist_ok=True)
    target_dir, drafter_dir = build(work, args.body_hidden, args.body_layers, args.body_vocab)
    prompts, seqs = random_seqs(args.body_vocab, args.samples, args.prompt, args.completion)
    best = ddtree_ratios(target_dir, drafter_dir, prompts, seqs, args.repeats)
    label = f"body-heavy {args.body_layers} x {args.body_hidden}, vocab {args.body_vocab}"
    print_ddtree(label, target_dir, best, 1.25)
