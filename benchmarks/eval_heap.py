"""The eval's CPU by the heap's mmap threshold (`remote.eval.walk.bound_heap`).

Below glibc's mmap threshold a buffer comes from the heap and is reused; at or above it,
from a fresh mapping whose pages fault in on first touch and go back to the OS on free.
The walk allocates many buffers of 1-16 MiB a drafter call (attention scores, head
logits, MLP rows), so a low threshold pays page faults on every call.

Setup: `eval_drafter_share`'s (a 27B's shape ratios at hidden 256, a trained 5-layer
block-16 drafter; cached under its ``--workdir``). Each threshold runs in its own process
(a threshold is the process's), the processes interleaved over ``--repeats`` rounds; each
times, after a warm-up, one eval of the samples in the default walk (DDTree budgets
included) and one with ``positions="all"``. Prints per threshold and mode the median
process CPU seconds of the eval and of its drafter part, the minor page faults, and
their ratios to the first threshold's (the baseline: 1 MiB, the setting before 16 MiB).

    python benchmarks/eval_heap.py [--samples 16 --train-samples 16] [--repeats 3]
        [--thresholds-mib 1,16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import load_avg  # noqa: E402 (benchmarks/ is on the path)

from remote.eval.device import computing  # noqa: E402

MODES = ("walk", "all")


def child(args) -> None:
    """One process at one threshold: a JSON line of each mode's CPU and faults."""
    import eval_drafter_share as share
    import torch

    from remote.eval import drafts, walk
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.protocol import DEFAULT_BUDGETS

    walk.MMAP_THRESHOLD = args.child * 2**20
    drafts.CLOCK = time.process_time
    sys.argv = [sys.argv[0], "--samples", str(args.samples), "--train-samples"]
    sys.argv += [str(args.train_samples), "--threads", str(args.threads)]
    target_dir, drafter_dir, rows, _facts = share.setup(share.parse_args())
    torch.set_num_threads(args.threads)
    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    out = {}
    with torch.inference_mode(), computing(torch.device("cpu")):
        for mode in MODES:
            share.engine(target, drafter, samples, mode, list(DEFAULT_BUDGETS))  # warm-up
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            cpu = time.process_time()
            recs = share.engine(target, drafter, samples, mode, list(DEFAULT_BUDGETS))
            out[mode] = {
                "cpu": time.process_time() - cpu,
                "drafter": sum(r["seconds"]["drafter"] for r in recs),
                "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                "rounds": [[r["rounds"], r["ddtree"]] for r in recs],
            }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--train-samples", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--thresholds-mib", default="1,16")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return child(args)
    thresholds = [int(t) for t in args.thresholds_mib.split(",")]
    here = os.path.dirname(os.path.abspath(__file__))
    runs: dict[int, list[dict]] = {t: [] for t in thresholds}
    before = load_avg()
    for r in range(args.repeats):
        for t in thresholds if r % 2 == 0 else thresholds[::-1]:
            cmd = [sys.executable, os.path.join(here, "eval_heap.py"), "--child", str(t)]
            cmd += ["--samples", str(args.samples), "--train-samples", str(args.train_samples)]
            cmd += ["--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[t].append(json.loads(done.stdout.splitlines()[-1]))
    base = thresholds[0]
    for mode in MODES:
        ref = runs[base][0][mode]["rounds"]
        if any(run[mode]["rounds"] != ref for t in thresholds for run in runs[t]):
            raise SystemExit(f"{mode}: the rounds differ between thresholds")
    print(
        f"{args.samples} samples, threads {args.threads}, default DDTree budgets; load average "
        f"{before} before, {load_avg()} after; median of {args.repeats} interleaved processes"
    )
    print(
        "  mmap threshold  mode   eval CPU s  drafter CPU s  minor faults   eval / drafter vs "
        f"{base} MiB"
    )
    for mode in MODES:
        med = {
            t: {
                k: statistics.median(run[mode][k] for run in runs[t])
                for k in ("cpu", "drafter", "faults")
            }
            for t in thresholds
        }
        for t in thresholds:
            m = med[t]
            print(
                f"  {t:>10} MiB  {mode:<5} {m['cpu']:11.2f}  {m['drafter']:13.2f}  "
                f"{m['faults']:12.0f}   {m['cpu'] / med[base]['cpu']:.3f} / "
                f"{m['drafter'] / med[base]['drafter']:.3f}"
            )


if __name__ == "__main__":
    main()
