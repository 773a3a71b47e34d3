"""How do eval time and memory grow with the context?

    python benchmarks/context.py [--contexts 1k,2k,4k,8k,16k] [--completion 64]
    python benchmarks/context.py --shapes tiny --contexts 1k,4k,16k,32k

Set-up (`common.models.build`): a random-weight Qwen3 target and a random 1-layer block-16
z-lab drafter, at two shapes: ``tiny`` (hidden 256, 4 layers, vocab 4096) and ``wide``
(hidden 1024, 8 layers, vocab 32000). For each context length, one sample: a random
prompt of that many tokens and a random completion of ``--completion`` tokens, evaluated
by a fresh ``python -m remote eval`` (`common.measure.run_child`), whose result gives the
eval's seconds split into the target's forward and the drafter's walk, and whose peak RSS
is read from the kernel. Printed per length, as ratios against the first (1k) point:

* eval seconds per completion token, and its target and drafter parts: the target's part
  is its one forward over the whole sequence (its own attention's work); the drafter's
  part attends every round over the context, so it grows as the context does (goal: no
  faster than the context itself, ``<= C / 1k`` x 1.25);
* peak RSS above the fixed runtime (python, torch, transformers, the target's code; the
  weights are a constant): the features, activations and context K/V of one sequence
  (goal: no faster than the context, ``<= C / 1k`` x 1.25: nothing quadratic).

A random drafter accepts about nothing (a round per completion token): the drafter's
heaviest walk. Each length is run ``--repeats`` times (best kept), the lengths interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from common.measure import goal, load_avg, load_now, run_child
from common.models import build, random_seqs

from remote.protocol.ladder import parse_rungs

SHAPES = {"tiny": (256, 4, 4096), "wide": (1024, 8, 32000)}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default="/tmp/dflash-bench")
    ap.add_argument("--contexts", default="1k,2k,4k,8k,16k", help="prompt lengths (k = 1024)")
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--shapes", default="tiny,wide", help=",".join(SHAPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    return ap


def one(target: str, drafter: str, vocab: int, context: int, args, work: str) -> dict:
    """A fresh eval of one sample at `context`: its peak RSS and its result's timings."""
    prompts, seqs = random_seqs(vocab, 1, context, args.completion, seed=context)
    gt = os.path.join(work, f"gt-{context}.jsonl")
    record = {"id": 0, "prompt_ids": prompts[0], "completion_ids": seqs[0][context:]}
    with open(gt, "w") as fh:
        fh.write(json.dumps(record) + "\n")
    out = os.path.join(work, f"out-{context}")
    spec = os.path.join(work, f"spec-{context}.json")
    with open(spec, "w") as fh:
        json.dump(
            {
                "target": target,
                "drafter": drafter,
                "ground_truth": gt,
                "output_dir": out,
                "threads": args.threads,
            },
            fh,
        )
    child = run_child(["-m", "remote", "eval", "--spec", spec])
    timings = json.load(open(os.path.join(out, "result.json")))["timings"]
    tokens = args.completion
    return {
        "peak": child.peak,
        "eval": timings["eval_s"] / tokens,
        "target": timings["target_forward_s"] / tokens,
        "drafter": timings["drafter_s"] / tokens,
    }


def shape(name: str, contexts: list[int], args) -> None:
    hidden, layers, vocab = SHAPES[name]
    target, drafter = build(args.workdir, hidden, layers, vocab)
    runtime = run_child(
        [
            "-c",
            "import remote.eval.engine, remote.eval.walk, remote.eval.drafter; "
            f"from remote.eval.target import describe; describe({target!r})",
        ]
    ).peak
    best: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dflash-bench-context-") as work:
        for r in range(args.repeats):
            for c in contexts if r % 2 == 0 else contexts[::-1]:
                got = one(target, drafter, vocab, c, args, work)
                print(
                    f"  {name} {c}: {1e3 * got['eval']:.2f} ms/token, peak "
                    f"{got['peak'] / 2**20:.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
                keep = best.setdefault(c, got)
                best[c] = {k: min(keep[k], got[k]) for k in got}
    base = best[contexts[0]]
    print(
        f"\n{name}: hidden {hidden}, {layers} layers, vocab {vocab}; completion "
        f"{args.completion} tokens, {args.threads} threads; {load_now()}"
    )
    print(
        f"{'context':>8} {'x ctx':>6} {'ms/token':>9} {'x eval':>7} {'x target':>9} "
        f"{'x drafter':>10} {'peak MiB':>9} {'x above runtime':>16}"
    )
    for c in contexts:
        b = best[c]
        above = (b["peak"] - runtime) / max(1, base["peak"] - runtime)
        print(
            f"{c:>8} {c / contexts[0]:>6.1f} {1e3 * b['eval']:>9.2f} "
            f"{b['eval'] / base['eval']:>7.2f} {b['target'] / base['target']:>9.2f} "
            f"{b['drafter'] / base['drafter']:>10.2f} {b['peak'] / 2**20:>9.0f} {above:>16.2f}"
        )
    last, grow = best[contexts[-1]], contexts[-1] / contexts[0]
    goal(
        f"{name}: drafter time per token at {contexts[-1]} / at {contexts[0]}",
        last["drafter"] / base["drafter"],
        "<=",
        1.25 * grow,
        f"the context grew {grow:g}x",
    )
    goal(
        f"{name}: peak RSS above the runtime at {contexts[-1]} / at {contexts[0]}",
        (last["peak"] - runtime) / max(1, base["peak"] - runtime),
        "<=",
        1.25 * grow,
        f"the context grew {grow:g}x",
    )


def main() -> None:
    args = parser().parse_args()
    contexts = parse_rungs(args.contexts)
    before = load_avg()
    for name in args.shapes.split(","):
        shape(name, contexts, args)
    print(f"\nload average (1, 5, 15 min): {before} before, {load_avg()} after")


if __name__ == "__main__":
    main()
