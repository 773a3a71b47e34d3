"""Benchmark the offline eval engine on a target big enough that weight streaming matters.

Prints ratios measured in ONE run on this machine (no absolute targets, no assertions):

* eval wall time / bare target forward time over the same tokens   (goal <= 1.25), without
  DDTree and with the CLI's default DDTree budgets 8,16,32,64 (goal <= 2.0 on this
  head-heavy target), and the same two on a body-heavy target whose LM head is ~5% of the
  weights, as a 27B model's (``--body-*``: 14 layers, hidden 1024, vocab 8192; goal <= 1.25
  with DDTree)
* online speculative-decoding loop time / offline eval time        (goal >= 5)
* peak RSS of a fresh ``python -m remote eval`` / weights' bytes   (goal <= 1.3), on this
  target and on a bigger one (``--rss-hidden``/``--rss-layers``, ~2.4 GB), with the fixed
  runtime (python + torch + transformers + the target's modeling code) printed beside it;
  and on a MoE VLM target (``--moe-hidden``/``--moe-layers``/``--moe-experts``, a
  Qwen3.5-MoE with a vision tower, ~2 GB: per-expert checkpoint keys that the loader fuses
  as transformers does, vision weights never read)

Setup: a random-weight Qwen3 target (default hidden 1536, 12 layers, vocab 32000: ~440M
parameters, ~0.9 GB in bf16) and a random 1-layer z-lab drafter (block 16), saved under
``--workdir`` (reused when present). Ground truth = the online loop's own greedy output, so
both sides walk the same tokens. A random drafter accepts ~nothing (tau ~1): the online loop's
worst case. For the offline eval it is the cheapest case: acceptance needs the drafter's last
layer and head only at about tau rows per position, and DDTree's walks visit every position
but its tree search stops at depth 1 when the ground truth is not among the top-k there (a
better drafter costs more rows per visit and fewer visits; ``rows_sensitivity`` shows the
chain's side of that).

``--completion 128,256,512,1024`` (a list) prints only the growth rows: eval time per
completion token with the default DDTree budgets (and its target / drafter / DDTree parts) as
a ratio to the first length (goal <= 1.3 at 1024), and the peak RSS of ``python -m remote
eval`` at each length above the fixed runtime, over the weights (goal <= 1.15 at 1024).

    python benchmarks/eval.py [--samples 2] [--prompt 128] [--completion 128] [--threads 2]
    python benchmarks/eval.py --rss-only     # the peak-RSS rows alone (random ground truth)
    python benchmarks/eval.py --ddtree-only  # the DDTree rows alone, both targets
    python benchmarks/eval.py --completion 128,256,512,1024 --samples 1   # growth rows
    python benchmarks/eval.py --e2e          # end to end: `dflash remote-eval` (loopback host,
                                             # local ground truth) vs a plain generate script
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import MODES, build, random_seqs  # noqa: E402 (benchmarks/ is on the path)
from eval_ddtree import body_ddtree, ddtree_ratios, print_ddtree  # noqa: E402
from eval_e2e import e2e_row  # noqa: E402
from eval_growth import growth_rows  # noqa: E402
from eval_rss import print_rss, rss_rows  # noqa: E402

from remote.eval.device import computing  # noqa: E402


def rows_sensitivity(target, drafter, prompts, seqs, repeats: int) -> dict[int, float]:
    """Seconds of the engine's target forward + drafter work if every position needed ``m``
    rows of the last drafter layer and head, as a drafter accepting about ``m - 1`` tokens
    per position does (the random drafter here needs about 1): how the eval/bare ratio grows
    with a better drafter, without training one."""
    import torch

    out: dict[int, float] = {}
    with torch.inference_mode(), computing(torch.device("cpu")):
        for m in (1, 3, 6):
            total = 0.0
            for p, g in zip(prompts, seqs, strict=False):
                best = float("inf")
                for _ in range(repeats):
                    t = time.perf_counter()
                    feats, _ = target.forward(
                        g, drafter.cfg.target_layer_ids, argmax_from=len(p) - 1
                    )
                    kv = drafter.context_kv(feats)
                    st = torch.arange(len(p), len(g) - 1)
                    blocks = drafter.blocks(kv, st, torch.tensor(g)[st], target.embed)
                    for j in range(1, m + 1):
                        rows = torch.arange(len(st)) * drafter.block_size + j
                        torch.argmax(
                            drafter.logits(blocks.hidden(rows), target.lm_head).float(), -1
                        )
                    best = min(best, time.perf_counter() - t)
                total += best
            out[m] = total
    return out


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default="/tmp/dflash-bench")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument(
        "--completion",
        default="128",
        help="completion tokens; a list (128,256,512,1024) gives only the growth rows: time "
        "per completion token vs the first length, peak RSS over the weights",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument(
        "--rss-hidden", type=int, default=2048, help="the bigger target of the RSS figure (0: skip)"
    )
    ap.add_argument("--rss-layers", type=int, default=24)
    ap.add_argument(
        "--moe-hidden",
        type=int,
        default=1024,
        help="the MoE VLM target of the RSS figure (0: skip)",
    )
    ap.add_argument("--moe-layers", type=int, default=12)
    ap.add_argument("--moe-experts", type=int, default=48)
    ap.add_argument(
        "--body-hidden",
        type=int,
        default=1024,
        help="the body-heavy target of the DDTree rows (head ~5%% of the weights, as a 27B "
        "model's; 0: skip)",
    )
    ap.add_argument("--body-layers", type=int, default=14)
    ap.add_argument("--body-vocab", type=int, default=8192)
    ap.add_argument(
        "--ddtree-only",
        action="store_true",
        help="only the DDTree rows (this target and the body-heavy one), random ground truth",
    )
    ap.add_argument(
        "--rss-only",
        action="store_true",
        help="only the peak-RSS rows, on random ground truth (no speed figures)",
    )
    ap.add_argument(
        "--e2e",
        action="store_true",
        help="only the end-to-end row: dflash remote-eval vs a plain generate script",
    )
    ap.add_argument("--e2e-hidden", type=int, default=256)
    ap.add_argument("--e2e-layers", type=int, default=4)
    ap.add_argument("--e2e-new", type=int, default=32)
    ap.add_argument(
        "--e2e-other-tree",
        default=None,
        help="also time the same remote-eval from this source tree in every round (before "
        "vs after a change)",
    )
    ap.add_argument(
        "--e2e-gt-concurrency",
        type=int,
        default=None,
        help="prompts per local generate call (dflash's default 16; 1: one at a time, "
        "as the plain script)",
    )
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.e2e:
        e2e_row(args)
        return
    import torch

    torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    target_dir, drafter_dir = build(args.workdir, args.hidden, args.layers, args.vocab)
    lengths = [int(x) for x in str(args.completion).split(",")]
    if len(lengths) > 1:
        growth_rows(args, target_dir, drafter_dir, lengths)
        return
    args.completion = lengths[0]
    if args.rss_only:
        prompts, seqs = random_seqs(args.vocab, args.samples, args.prompt, args.completion)
        print_rss(rss_rows(args, target_dir, drafter_dir, prompts, seqs))
        return
    if args.ddtree_only:
        prompts, seqs = random_seqs(args.vocab, args.samples, args.prompt, args.completion)
        best = ddtree_ratios(target_dir, drafter_dir, prompts, seqs, args.repeats)
        print_ddtree(f"{args.layers} x {args.hidden}, vocab {args.vocab}", target_dir, best, 2.0)
        body_ddtree(args)
        return
    speed_rows(args, target_dir, drafter_dir)


def speed_rows(args, target_dir: str, drafter_dir: str) -> None:
    """The default rows: the online loop's time, then the bare forward and the offline eval
    in every walk mode over the online loop's own output, then the RSS rows."""
    online = time_online(args, target_dir, drafter_dir)
    offline = time_offline(args, target_dir, drafter_dir, online)
    rss = rss_rows(args, target_dir, drafter_dir, online["prompts"], online["seqs"])
    print_speed(args, target_dir, online, offline, rss)
    body_ddtree(args)
    for mode in MODES:
        goal = f"  (goal >= 5; online {online['seconds']:.1f} s)" if mode == "all" else ""
        ratio = online["seconds"] / offline["best"][mode]
        print(f"online loop / offline eval [{mode:10}]     = {ratio:.1f}x{goal}")
    print_rss(rss)


def time_online(args, target_dir: str, drafter_dir: str) -> dict:
    """The reference online loop (`orchestrator.demo.oracle`) over random prompts: its
    seconds, its rounds and the sequences it produced (the offline eval's ground truth)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from orchestrator.demo.oracle import online_rounds
    from remote.eval.drafter import load_drafter

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    drafter, _report = load_drafter(drafter_dir, torch.bfloat16)
    rng = random.Random(0)
    prompts = [
        [rng.randrange(10, args.vocab) for _ in range(args.prompt)] for _ in range(args.samples)
    ]
    with torch.inference_mode(), computing(torch.device("cpu")):
        online_rounds(hf, drafter, prompts[0][:16], 4)  # warm-up
        t = time.perf_counter()
        runs = [online_rounds(hf, drafter, p, args.completion) for p in prompts]
        t_online = time.perf_counter() - t  # one run: minutes long, less sensitive to bursts
    seqs = [p + c for p, (_r, c) in zip(prompts, runs, strict=False)]
    return {
        "seconds": t_online,
        "prompts": prompts,
        "seqs": seqs,
        "rounds": [r for r, _c in runs],
        "block_size": drafter.block_size,
    }


def time_offline(args, target_dir: str, drafter_dir: str, online: dict) -> dict:
    """The bare HF forward and the offline eval in every walk mode (`MODES`) over the
    online loop's sequences, interleaved sample by sample, best of ``--repeats``: on a
    shared machine this keeps other load from skewing one side only. Checks the walk
    gives the online loop's rounds; ``rows``: `rows_sensitivity`."""
    import torch
    from transformers import AutoModelForCausalLM

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    prompts, seqs = online["prompts"], online["seqs"]
    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    drafter, _report = load_drafter(drafter_dir, torch.bfloat16)
    target = load_target(target_dir, torch.bfloat16)
    best = {k: 0.0 for k in ("bare", "engine_target", *MODES)}
    recs_all = []
    with torch.inference_mode(), computing(torch.device("cpu")):
        hf(input_ids=torch.tensor([seqs[0][:32]]))  # warm-up
        eval_sequence(target, drafter, prompts[0][:16], seqs[0][16:40], WalkOptions(budgets=[8]))
        for p, g in zip(prompts, seqs, strict=False):
            per = {k: float("inf") for k in best}
            for _ in range(args.repeats):
                t = time.perf_counter()
                hf(input_ids=torch.tensor([g]))
                per["bare"] = min(per["bare"], time.perf_counter() - t)
                for mode, kw in MODES.items():
                    t = time.perf_counter()
                    rec = eval_sequence(target, drafter, p, g[len(p) :], WalkOptions(**kw))
                    per[mode] = min(per[mode], time.perf_counter() - t)
                    if mode == "all":
                        per["engine_target"] = min(per["engine_target"], rec["seconds"]["target"])
                        rec_all = rec
            for k in best:
                best[k] += per[k]
            recs_all.append(rec_all)
    for rounds, rec in zip(online["rounds"], recs_all, strict=False):
        assert rec["rounds"] == rounds, (
            "offline walk disagrees with the online loop"
        )  # sanity, not timing
    return {"best": best, "rows": rows_sensitivity(target, drafter, prompts, seqs, args.repeats)}


def print_speed(args, target_dir: str, online: dict, offline: dict, rss: list[tuple]) -> None:
    """The setup line and the eval / bare forward rows."""
    from remote.eval.target import describe

    best, rows_cost = offline["best"], offline["rows"]
    t_bare = best["bare"]
    _c, _meta, info = describe(target_dir)
    tokens = sum(len(g) for g in online["seqs"])
    rounds = sum(len(r) for r in online["rounds"])
    print(
        f"setup: target {info.num_layers} layers hidden "
        f"{info.hidden_size} vocab {info.vocab_size}, "
        f"weights {rss[0][3] / 2**20:.0f} MiB bf16; drafter 1 layer, block "
        f"{online['block_size']}; {args.samples} samples x ({args.prompt} prompt + "
        f"{args.completion} completion) = {tokens} tokens; "
        f"{rounds} online rounds (tau "
        f"{sum(map(sum, online['rounds'])) / rounds:.2f}); threads {args.threads}"
    )
    print(
        f"bare target forward (HF, full logits): {t_bare:.2f} s "
        f"(best of {args.repeats}, interleaved with the eval runs)"
    )
    for mode in MODES:
        goal = {"all": "goal <= 1.25; ", "all+DDTree": "goal <= 2.0; "}.get(mode, "")
        print(
            f"eval [{mode:10}] wall / bare target forward = "
            f"{best[mode] / t_bare:.2f}   ({goal}eval {best[mode]:.2f} s)"
        )
    print(
        "  of which engine target forward / bare         = "
        f"{best['engine_target'] / t_bare:.2f}   (hooks + text backbone + argmax head)"
    )
    print(
        "  with a drafter that accepts more (m rows of the last layer + head per position, ~tau): "
        + ", ".join(f"m={m}: {t / t_bare:.2f}" for m, t in rows_cost.items())
    )


if __name__ == "__main__":
    main()
