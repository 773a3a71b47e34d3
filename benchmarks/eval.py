"""How close is the offline eval to a bare target forward over the same tokens?

    python benchmarks/eval.py [--samples 2] [--prompt 128] [--completion 128] [--threads 2]
    python benchmarks/eval.py --ddtree-only    # with DDTree: head-heavy and body-heavy target
    python benchmarks/eval.py --completion 128,256,512,1024 --samples 1   # growth rows

Setup (`common.models`): a random-weight Qwen3 target big enough that weight streaming
matters (hidden 1536, 12 layers, vocab 32000: ~0.9 GB in bf16) and a random 1-layer z-lab
drafter (block 16), built under ``--workdir`` once. All figures come from ONE run, the
modes interleaved sample by sample, best of ``--repeats``:

* default: the reference online speculative loop (`orchestrator.demo.oracle`) over random
  prompts, whose own greedy output is the ground truth (both sides walk the same tokens);
  then the bare transformers forward and the eval in each walk mode (`common.models.MODES`)
  over it: eval / bare (goal <= 1.25 without DDTree, <= 2.0 with the default budgets on
  this head-heavy target), online loop / eval (goal >= 5), and how eval / bare grows when
  a drafter accepts more (``m`` rows of the last drafter layer and head per position);
* ``--ddtree-only``: eval with and without the default DDTree budgets / bare, random ground
  truth, on this target and on a body-heavy one whose LM head is ~5% of the weights, as a
  27B's (``--body-*``; goal <= 1.25 with DDTree);
* ``--completion`` a list: eval time per completion token (default budgets) at each length
  over the first's, with its target / drafter / DDTree parts (goal <= 1.3 at 1024), and a
  fresh ``remote eval``'s peak RSS above the fixed runtime over the weights (<= 1.15).

A random drafter accepts about nothing (tau ~1): the online loop's worst case and the
offline eval's cheapest (acceptance needs the drafter's last layer and head at about tau
rows per position; DDTree's search stops at depth 1 when the ground truth is not among the
top-k there). The rounds must equal the online loop's, or it stops.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

from common.measure import goal, interleave, load_avg
from common.models import MODES, build, eval_rss, head_share, random_seqs, weight_bytes

from remote.eval.device import computing
from remote.protocol import DEFAULT_BUDGETS


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default="/tmp/dflash-bench")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--completion", default="128", help="completion tokens; a list: growth rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--ddtree-only", action="store_true", help="only the DDTree rows")
    ap.add_argument("--body-hidden", type=int, default=1024, help="body-heavy target (0: skip)")
    ap.add_argument("--body-layers", type=int, default=14)
    ap.add_argument("--body-vocab", type=int, default=8192)
    return ap


def loaded(target_dir: str, drafter_dir: str):
    """(transformers model, engine target, drafter) in bf16."""
    import torch
    from transformers import AutoModelForCausalLM

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    drafter, _report = load_drafter(drafter_dir, torch.bfloat16)
    return hf, load_target(target_dir, torch.bfloat16), drafter


def against_bare(hf, target, drafter, prompts, seqs, modes: dict, repeats: int):
    """Summed over the samples, each mode's best of ``repeats`` interleaved rounds: the
    bare forward (``bare``) and the eval in each of ``modes`` (label -> WalkOptions); each
    mode's records of the last round."""
    import torch

    from remote.eval.walk import eval_sequence

    best = dict.fromkeys(("bare", *modes), 0.0)
    records: dict[str, list[dict]] = {label: [] for label in modes}
    with torch.inference_mode(), computing(torch.device("cpu")):
        hf(input_ids=torch.tensor([seqs[0][:32]]))  # warm-up
        eval_sequence(target, drafter, prompts[0][:16], seqs[0][16:40], list(modes.values())[-1])
        for p, g in zip(prompts, seqs, strict=True):
            kept: dict[str, dict] = {}

            def bare(g=g) -> None:
                hf(input_ids=torch.tensor([g]))

            def walk(label: str, p=p, g=g, kept=kept) -> None:
                kept[label] = eval_sequence(target, drafter, p, g[len(p) :], modes[label])

            runs = {"bare": bare} | {label: partial(walk, label) for label in modes}
            got = interleave(runs, repeats)
            for k in best:
                best[k] += got.best(k)
            for label in modes:
                records[label].append(kept[label])
    return best, records


def rows_sensitivity(target, drafter, prompts, seqs, repeats: int) -> dict[int, float]:
    """Seconds of the engine's target forward + drafter work if every position needed ``m``
    rows of the last drafter layer and head, as a drafter accepting about ``m - 1`` tokens
    per position does: how eval / bare grows with a better drafter, without training one."""
    import torch

    out: dict[int, float] = {}
    with torch.inference_mode(), computing(torch.device("cpu")):
        for m in (1, 3, 6):
            total = 0.0
            for p, g in zip(prompts, seqs, strict=True):
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


def speed_rows(args, target_dir: str, drafter_dir: str) -> None:
    """The online loop over random prompts, then bare and eval over its output."""
    import random

    import torch

    from orchestrator.demo.oracle import online_rounds
    from remote.eval.walk import WalkOptions

    hf, target, drafter = loaded(target_dir, drafter_dir)
    rng = random.Random(0)
    prompts = [
        [rng.randrange(10, args.vocab) for _ in range(args.prompt)] for _ in range(args.samples)
    ]
    with torch.inference_mode(), computing(torch.device("cpu")):
        online_rounds(hf, drafter, prompts[0][:16], 4)  # warm-up
        t = time.perf_counter()
        runs = [online_rounds(hf, drafter, p, args.completion) for p in prompts]
        t_online = time.perf_counter() - t  # one run: minutes long, less sensitive to bursts
    seqs = [p + c for p, (_r, c) in zip(prompts, runs, strict=True)]
    modes = {label: WalkOptions(**kw) for label, kw in MODES.items()}
    best, records = against_bare(hf, target, drafter, prompts, seqs, modes, args.repeats)
    if [r["rounds"] for r in records["all"]] != [r for r, _c in runs]:
        raise SystemExit("the offline walk disagrees with the online loop")
    rows = rows_sensitivity(target, drafter, prompts, seqs, args.repeats)
    rounds = sum(len(r) for r, _c in runs)
    print(
        f"setup: target {args.layers} layers hidden {args.hidden} vocab {args.vocab}, weights "
        f"{weight_bytes(target_dir) / 2**20:.0f} MiB bf16; drafter 1 layer, block "
        f"{drafter.block_size}; {args.samples} samples x ({args.prompt} prompt + "
        f"{args.completion} completion); {rounds} online rounds (tau "
        f"{sum(sum(r) for r, _c in runs) / rounds:.2f}); threads {args.threads}; load avg "
        f"{load_avg()}"
    )
    bare = best["bare"]
    print(f"bare target forward (HF, full logits): {bare:.2f} s (best of {args.repeats})")
    goals = {"all": 1.25, "all+DDTree": 2.0}
    for mode in MODES:
        label = f"eval [{mode:10}] wall / bare target forward"
        if mode in goals:
            goal(label, best[mode] / bare, "<=", goals[mode], f"eval {best[mode]:.2f} s")
        else:
            print(f"{label} = {best[mode] / bare:.2f}   (eval {best[mode]:.2f} s)")
    engine_target = sum(r["seconds"]["target"] for r in records["all"])
    print(
        f"  of which engine target forward / bare = {engine_target / bare:.2f}   (hooks + text "
        "backbone + argmax head; the last round)"
    )
    print(
        "  with a drafter that accepts more (m rows of the last layer + head per position, "
        "~tau): " + ", ".join(f"m={m}: {t / bare:.2f}" for m, t in rows.items())
    )
    goal("online loop / offline eval [all]", t_online / best["all"], ">=", 5, f"{t_online:.1f} s")


def ddtree_rows(args, label: str, hidden: int, layers: int, vocab: int, bound: float) -> None:
    """Eval without and with the default DDTree budgets / bare, random ground truth."""
    from remote.eval.walk import WalkOptions

    target_dir, drafter_dir = build(args.workdir, hidden, layers, vocab)
    prompts, seqs = random_seqs(vocab, args.samples, args.prompt, args.completion)
    modes = {
        "all": WalkOptions(positions="all"),
        "all+DDTree": WalkOptions(budgets=list(DEFAULT_BUDGETS), positions="all"),
    }
    hf, target, drafter = loaded(target_dir, drafter_dir)
    best, _ = against_bare(hf, target, drafter, prompts, seqs, modes, args.repeats)
    print(
        f"DDTree [{label}, {layers} x {hidden}, vocab {vocab}, head "
        f"{100 * head_share(target_dir):.1f}% of the weights]: bare forward {best['bare']:.2f} s;"
        f" load avg {load_avg()}"
    )
    print(f"  eval [all       ] / bare = {best['all'] / best['bare']:.2f}")
    budgets = ",".join(map(str, DEFAULT_BUDGETS))
    goal("  eval [all+DDTree] / bare", best["all+DDTree"] / best["bare"], "<=", bound, budgets)


def growth_times(args, target_dir: str, drafter_dir: str, seqs: dict):
    """Each length's eval seconds per completion token, by part (default DDTree budgets),
    in interleaved rounds; the models are freed on return, before the RSS children."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    opts = WalkOptions(budgets=list(DEFAULT_BUDGETS))

    def length(n: int) -> dict:
        parts = dict.fromkeys(("total", "target", "drafter", "ddtree"), 0.0)
        for p, g in zip(*seqs[n], strict=True):
            rec = eval_sequence(target, drafter, p, g[len(p) :], opts)
            for k in parts:
                parts[k] += rec["seconds"][k] / (n * args.samples)
        return parts

    with torch.inference_mode():
        eval_sequence(target, drafter, [5] * 16, [6] * 24, opts)  # warm-up
        return interleave({n: partial(length, n) for n in seqs}, args.repeats)


def growth_rows(args, target_dir: str, drafter_dir: str, lengths: list[int]) -> None:
    """Eval time per completion token at each length over the first's, with its parts, and
    ``remote eval``'s peak RSS above the runtime over the weights."""
    seqs = {n: random_seqs(args.vocab, args.samples, args.prompt, n, seed=n) for n in lengths}
    got = growth_times(args, target_dir, drafter_dir, seqs)
    print(
        f"growth: prompt {args.prompt}, {args.samples} sample(s) per length, budgets "
        f"{','.join(map(str, DEFAULT_BUDGETS))}, threads {args.threads}, best of "
        f"{args.repeats} interleaved rounds; load avg {load_avg()}"
    )
    print(
        "  completion  ms/token  ratio vs first (goal <= 1.3)  [target drafter ddtree]"
        "  (peak RSS - runtime) / weights (goal <= 1.15)"
    )
    first = {k: got.best(lengths[0], k) for k in ("total", "target", "drafter", "ddtree")}
    for n in lengths:
        t = {k: got.best(n, k) for k in first}
        peak, base, weights = eval_rss(
            target_dir,
            drafter_dir,
            *seqs[n],
            args.threads,
            DEFAULT_BUDGETS,
        )
        parts = " ".join(
            f"{t[k] / first[k]:.2f}" if first[k] else "-" for k in ("target", "drafter", "ddtree")
        )
        print(
            f"  {n:10d}  {1000 * t['total']:8.2f}  {t['total'] / first['total']:28.2f}  [{parts}]"
            f"  {(peak - base) / weights:.2f} (peak {peak / 2**20:.0f} MiB, runtime "
            f"{base / 2**20:.0f} MiB, weights {weights / 2**20:.0f} MiB)"
        )


def main() -> None:
    args = parser().parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    target_dir, drafter_dir = build(args.workdir, args.hidden, args.layers, args.vocab)
    lengths = [int(x) for x in str(args.completion).split(",")]
    if len(lengths) > 1:
        return growth_rows(args, target_dir, drafter_dir, lengths)
    args.completion = lengths[0]
    if not args.ddtree_only:
        return speed_rows(args, target_dir, drafter_dir)
    ddtree_rows(args, "head-heavy", args.hidden, args.layers, args.vocab, 2.0)
    if args.body_hidden:
        body = (args.body_hidden, args.body_layers, args.body_vocab)
        ddtree_rows(args, "body-heavy", *body, 1.25)


if __name__ == "__main__":
    main()
