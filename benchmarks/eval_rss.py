"""The peak-RSS rows of `benchmarks/eval.py`: a fresh ``python -m remote eval``'s peak RSS
over the weights' bytes, beside the fixed runtime (python, torch, transformers, the
target's modeling code), on this target, a bigger dense one and a MoE VLM."""

from __future__ import annotations

import json
import os

from common import build, build_moe, peak_rss_of  # noqa: E402 (benchmarks/ is on the path)


def rss_figures(
    workdir: str,
    target_dir: str,
    drafter_dir: str,
    prompts,
    seqs,
    threads: int,
    budgets: list[int] | None = None,
) -> tuple[int, int, int]:
    """(peak RSS of ``python -m remote eval``, fixed runtime RSS, weights' bytes) on one target,
    with DDTree ``budgets`` (none by default)."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import describe, text_weight_bytes

    gt = os.path.join(workdir, "gt.jsonl")
    with open(gt, "w") as fh:
        for i, (p, g) in enumerate(zip(prompts, seqs, strict=False)):
            fh.write(json.dumps({"id": i, "prompt_ids": p, "completion_ids": g[len(p) :]}) + "\n")
    spec = os.path.join(workdir, "job.json")
    json.dump(
        {
            "target": target_dir,
            "drafter": drafter_dir,
            "ground_truth": gt,
            "output_dir": os.path.join(workdir, "out"),
            "threads": threads,
            "budgets": budgets or [],
        },
        open(spec, "w"),
    )
    # The runtime an eval cannot do without: interpreter, torch, transformers and the
    # target's modeling code (whose import pulls in much of transformers and torch._dynamo).
    base = peak_rss_of(
        [
            "-c",
            "import remote.eval.engine, remote.eval.walk, remote.eval.drafter; "
            f"from remote.eval.target import describe; describe({target_dir!r})",
        ]
    )
    peak = peak_rss_of(["-m", "remote", "eval", "--spec", spec])
    _c, meta, info = describe(target_dir)
    _d, report = load_drafter(drafter_dir, torch.bfloat16)
    return peak, base, text_weight_bytes(meta, info, torch.bfloat16) + report.parameters * 2


def rss_rows(args, target_dir: str, drafter_dir: str, prompts, seqs) -> list[tuple]:
    """(label, peak, runtime, weights) for this target, the bigger dense one, the MoE VLM."""
    rss = [
        (
            "this target",
            *rss_figures(args.workdir, target_dir, drafter_dir, prompts, seqs, args.threads),
        )
    ]
    if args.rss_hidden:
        big = os.path.join(args.workdir, f"rss-{args.rss_hidden}x{args.rss_layers}")
        os.makedirs(big, exist_ok=True)
        big_target, big_drafter = build(big, args.rss_hidden, args.rss_layers, args.vocab)
        rss.append(
            (
                f"{args.rss_hidden} x {args.rss_layers} target",
                *rss_figures(big, big_target, big_drafter, prompts, seqs, args.threads),
            )
        )
    if args.moe_hidden:
        moe = os.path.join(
            args.workdir, f"moe-{args.moe_hidden}x{args.moe_layers}x{args.moe_experts}"
        )
        os.makedirs(moe, exist_ok=True)
        moe_target, moe_drafter = build_moe(
            moe, args.moe_hidden, args.moe_layers, args.moe_experts, args.vocab
        )
        label = f"MoE VLM {args.moe_hidden} x {args.moe_layers}, {args.moe_experts} experts"
        rss.append((label, *rss_figures(moe, moe_target, moe_drafter, prompts, seqs, args.threads)))
    return rss


def print_rss(rss: list[tuple]) -> None:
    for label, peak, base, weights in rss:
        print(
            f"peak RSS of `remote eval` / weights' bytes [{label}] = "
            f"{peak / weights:.2f}   (goal <= 1.3; peak {peak / 2**20:.0f} MiB, "
            f"weights {weights / 2**20:.0f} MiB)"
        )
        print(
            f"  fixed runtime (python+torch+transformers+modeling code) {base / 2**20:.0f} MiB; "
            f"(peak - runtime) / weights = {(peak - base) / weights:.2f}"
        )
