"""CPU threads for a tiny target: torch's own count against the one thread a job picks for
a target under `remote.eval.device.SMALL_TARGET_BYTES` (`auto_threads`).

    python benchmarks/eval_threads.py [--repeats 3] [--samples 8] [--tokens 128]

The demo's models (its cache, built if missing): the tiny Qwen3.5-VL target and the
step-150 drafter. Each round, interleaved, a fresh child per way (threads are set once per
process) times its wall clock for the two phases of a first eval: local ground-truth
generation (the samples in one ``generate`` batch) and the eval itself (`run_eval`, DDTree
8-64, no feature cache, round costs included). Prints each way's median, torch's / one
thread's, whether the rounds agree, and the load average: on an idle box the two ways are
close, on a busy one torch's threads mostly wait for each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT
from common.measure import load_avg

CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
import torch
if args["threads"]:
    torch.set_num_threads(args["threads"])
from remote.eval.engine import run_eval
from remote.eval.groundtruth.local import LocalGenerator
from remote.model.quiet import transformers_quiet
from remote.protocol import EvalSpec

with transformers_quiet():
    gen = LocalGenerator(args["target"], "bfloat16", None)
    t = time.perf_counter()
    done = gen.generate_batch(args["prompts"], {"max_new_tokens": args["tokens"]})
    gt_s = time.perf_counter() - t
    with open(args["gt"], "w") as fh:
        for i, (p, c) in enumerate(zip(args["prompts"], done)):
            fh.write(json.dumps({"id": i, "prompt_ids": p, "completion_ids": c}) + "\n")
    spec = EvalSpec(target=args["target"], drafter=args["drafter"], ground_truth=args["gt"],
                    output_dir=args["out"], budgets=(8, 16, 32, 64))
    t = time.perf_counter()
    result = run_eval(spec, on_event=lambda e: None)
    eval_s = time.perf_counter() - t
rounds = [json.loads(line)["rounds"] for line in open(args["out"] + "/samples.jsonl")]
print(json.dumps({"gt_s": gt_s, "eval_s": eval_s, "threads": torch.get_num_threads(),
                  "rounds": rounds, "completions": done}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    from orchestrator.demo.build import ensure_assets

    assets = ensure_assets()
    drafter = next(p for p in assets.checkpoints if p.name == "step-150")
    prompts = [[5 + i, 7, 9, 11, 13, 17, 19, 23][: 4 + i % 4] for i in range(args.samples)]
    ways = {"torch": 0, "one": 1}
    times: dict[str, dict[str, list[float]]] = {w: {"gt_s": [], "eval_s": []} for w in ways}
    seen: dict[str, dict] = {}
    load = load_avg()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for way in ways if r % 2 == 0 else list(ways)[::-1]:
                out = Path(tmp, f"{way}-{r}")
                out.mkdir()
                doc = {
                    "threads": ways[way],
                    "target": str(assets.target),
                    "drafter": str(drafter),
                    "prompts": prompts,
                    "tokens": args.tokens,
                    "gt": str(out / "gt.jsonl"),
                    "out": str(out),
                }
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                proc = subprocess.run(
                    [sys.executable, "-c", CHILD, json.dumps(doc)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                for phase in ("gt_s", "eval_s"):
                    times[way][phase].append(got[phase])
                seen[way] = got
    print(
        f"demo target {assets.target} (step-150 drafter); {args.samples} samples x "
        f"{args.tokens} tokens; DDTree 8-64; torch's threads here: {seen['torch']['threads']}"
    )
    print(f"load average (1, 5, 15 min): {load} before, {load_avg()} after")
    for phase, what in (("gt_s", "local ground truth"), ("eval_s", "eval (walk + costs)")):
        med = {w: statistics.median(times[w][phase]) for w in ways}
        print(
            f"  {what:22s} torch's {med['torch']:7.2f} s  one thread {med['one']:7.2f} s  "
            f"torch's / one {med['torch'] / med['one']:.2f}"
        )
    same = seen["torch"]["rounds"] == seen["one"]["rounds"]
    same_gt = seen["torch"]["completions"] == seen["one"]["completions"]
    print(f"  same ground truth both ways: {same_gt}; same rounds both ways: {same}")
    print(f"  ({time.strftime('%Y-%m-%d %H:%M')}, {args.repeats} rounds, medians)")


if __name__ == "__main__":
    main()
