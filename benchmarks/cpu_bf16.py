"""bfloat16 products on this CPU: torch's own kernels (``native``) against the engine's
widened float32 products (``float32``, `remote.eval.cpu_bf16`), at a 27B's proportions.

    python benchmarks/cpu_bf16.py [--repeats 3] [--threads 1] [--drafter DIR]

The set-up is eval_drafter_share's (its options; its target, samples and trained drafter,
cached under ``--workdir``; ``--drafter`` measures a checkpoint of a training there
instead of training one). Measured in ONE run, rounds interleaved, process CPU seconds
(median of ``--repeats``), each way: a bare transformers forward of the target over each
sample, and the default eval (`remote.eval.walk.eval_batch`, DDTree ``--budgets``).
Prints whether this CPU has bfloat16 kernels (which way the engine goes here), each time,
float32 / native for each, eval / bare each way, on how many samples the two ways give the
same rounds, and the token-weighted tau each way.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_drafter_share import engine, load_avg, loaded, parser  # noqa: E402


def main() -> None:
    ap = parser(__doc__)
    ap.set_defaults(repeats=3, threads=1)
    args = ap.parse_args()
    import torch

    from remote.eval import cpu_bf16

    budgets = [int(b) for b in args.budgets.split(",") if b]
    m = loaded(args)
    target, drafter, hf, samples, facts = m.target, m.drafter, m.hf, m.samples, m.facts
    tokens = sum(len(p) + len(c) for p, c in samples)
    print(
        f"setup: eval_drafter_share's; drafter {facts['drafter']}; {len(samples)} samples, "
        f"{tokens} tokens; DDTree {args.budgets or 'none'}; threads {args.threads}; torch "
        f"{torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        f"this CPU has bfloat16 kernels: {cpu_bf16.native_supported()} (the engine's way "
        f"here: {cpu_bf16.policy()})"
    )

    def bare() -> None:
        for p, c in samples:
            hf(input_ids=torch.tensor([p + c]))

    def walk() -> list[dict]:
        return engine(target, drafter, samples, "walk", budgets)

    times: dict[tuple[str, str], list[float]] = {}
    recs: dict[str, list[dict]] = {}
    load = load_avg()
    with torch.inference_mode():
        for way in cpu_bf16.POLICIES:  # warm-up, untimed
            with cpu_bf16.widened(way):
                bare()
                walk()
        for r in range(args.repeats):
            for way in cpu_bf16.POLICIES if r % 2 == 0 else cpu_bf16.POLICIES[::-1]:
                with cpu_bf16.widened(way):
                    for what, run in (("bare", bare), ("eval", walk)):
                        t = time.process_time()
                        got = run()
                        times.setdefault((way, what), []).append(time.process_time() - t)
                        if got is not None:
                            recs[way] = got
    print(f"load average (1, 5, 15 min): {load} before, {load_avg()} after")
    med = {k: statistics.median(v) for k, v in times.items()}
    for way in cpu_bf16.POLICIES:
        b, e = med[(way, "bare")], med[(way, "eval")]
        print(
            f"  {way:8s} bare forward {b:8.2f} CPU-s  eval {e:8.2f} CPU-s  eval / bare {e / b:.2f}"
        )
    for what in ("bare", "eval"):
        ratio = med[("float32", what)] / med[("native", what)]
        print(f"float32 / native, {what}: {ratio:.3f}")
    pairs = list(zip(recs["native"], recs["float32"], strict=True))
    chain = sum(a["rounds"] == b["rounds"] for a, b in pairs)
    trees = sum(a["ddtree"] == b["ddtree"] for a, b in pairs)
    print(
        f"same rounds: chain {chain} of {len(pairs)} samples, DDTree {trees} of {len(pairs)} "
        "(elsewhere a bfloat16 near-tie fell the other way, as between two CPUs' kernels)"
    )
    for way in cpu_bf16.POLICIES:
        rounds = [r["rounds"] for r in recs[way]]
        tau = sum(map(sum, rounds)) / sum(map(len, rounds))
        print(f"  {way:8s} tau {tau:.3f} token-weighted")


if __name__ == "__main__":
    main()
