"""The growth rows of `benchmarks/eval.py`: eval time per completion token, and peak RSS
above the runtime, as completions grow."""

from __future__ import annotations

import os

from common import random_seqs  # noqa: E402 (benchmarks/ is on the path)
from eval_rss import rss_figures  # noqa: E402

from remote.protocol import DEFAULT_BUDGETS


def growth_rows(args, target_dir: str, drafter_dir: str, lengths: list[int]) -> None:
    """Eval time per completion token (default DDTree budgets included) at each completion
    length, as a ratio to the first length, with its target / drafter / DDTree parts; and
    the peak RSS of ``python -m remote eval`` above the fixed runtime, over the weights."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    opts = WalkOptions(budgets=list(DEFAULT_BUDGETS))
    seqs = {n: random_seqs(args.vocab, args.samples, args.prompt, n, seed=n) for n in lengths}
    best: dict[int, dict[str, float]] = {n: {} for n in lengths}
    with torch.inference_mode():
        eval_sequence(target, drafter, [5] * 16, [6] * 24, opts)  # warm-up
        for _ in range(args.repeats):  # lengths interleaved within each round
            for n in lengths:
                part = {"total": 0.0, "target": 0.0, "drafter": 0.0, "ddtree": 0.0}
                for p, g in zip(*seqs[n], strict=True):
                    rec = eval_sequence(target, drafter, p, g[len(p) :], opts)
                    for k in part:
                        part[k] += rec["seconds"][k]
                for k, v in part.items():
                    best[n][k] = min(best[n].get(k, float("inf")), v)
    del target, drafter
    rss = {}
    for n in lengths:
        work = os.path.join(args.workdir, f"growth-{n}")
        os.makedirs(work, exist_ok=True)
        rss[n] = rss_figures(
            work, target_dir, drafter_dir, *seqs[n], args.threads, list(DEFAULT_BUDGETS)
        )
    first = lengths[0]
    per_tok = {n: {k: v / (n * args.samples) for k, v in b.items()} for n, b in best.items()}
    print(
        f"growth: prompt {args.prompt}, {args.samples} sample(s) per length, budgets "
        f"{','.join(map(str, list(DEFAULT_BUDGETS)))}, threads {args.threads}, best of "
        f"{args.repeats} interleaved rounds; load avg "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(
        "  completion  ms/token  ratio vs first (goal <= 1.3)  [target drafter ddtree]"
        "  (peak RSS - runtime) / weights (goal <= 1.15)"
    )
    for n in lengths:
        t, f = per_tok[n], per_tok[first]
        peak, base, weights = rss[n]
        parts = " ".join(
            f"{t[k] / f[k]:.2f}" if f[k] else "-" for k in ("target", "drafter", "ddtree")
        )
        print(
            f"  {n:10d}  {1000 * t['total']:8.2f}  {t['total'] / f['total']:28.2f}  [{parts}]"
            f"  {(peak - base) / weights:.2f} (peak {peak / 2**20:.0f} MiB, runtime "
            f"{base / 2**20:.0f} MiB, weights {weights / 2**20:.0f} MiB)"
        )
