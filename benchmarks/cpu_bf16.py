"""Which way are bfloat16 products faster on this CPU: torch's own kernels (``native``) or
the engine's widened float32 products (``float32``, `remote.eval.cpu_bf16`)?

    python benchmarks/cpu_bf16.py [--repeats 3] [--threads 1] [--drafter DIR]

Setup: the trained 27B-shaped pair (`common.pair`, its options; ``--drafter`` measures a
checkpoint of a training there instead of training one). Measured in ONE run, rounds
interleaved, process CPU seconds (median of ``--repeats``), each way: a bare transformers
forward of the target over each sample, and the default eval (`remote.eval.walk.eval_batch`,
DDTree ``--budgets``). Prints whether this CPU has bfloat16 kernels (which way the engine
goes here), each time, float32 / native for each, eval / bare each way, on how many samples
the two ways give the same rounds, and the token-weighted tau each way.
"""

from __future__ import annotations

from functools import partial

from common.measure import interleave, load_avg, loads
from common.pair import bare, budget_list, engine, loaded, parser, tau


def main() -> None:
    ap = parser(__doc__)
    ap.set_defaults(repeats=3, threads=1)
    args = ap.parse_args()
    import torch

    from remote.eval import cpu_bf16

    budgets = budget_list(args)
    m = loaded(args)
    tokens = sum(len(p) + len(c) for p, c in m.samples)
    print(
        f"setup: the 27B-shaped pair; drafter {m.facts['drafter']}; {len(m.samples)} samples, "
        f"{tokens} tokens; DDTree {args.budgets or 'none'}; threads {args.threads}; torch "
        f"{torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        f"this CPU has bfloat16 kernels: {cpu_bf16.native_supported()} (the engine's way "
        f"here: {cpu_bf16.policy()})"
    )

    recs: dict[str, list[dict]] = {}

    def way(name: str, what: str) -> None:
        with cpu_bf16.widened(name):
            if what == "bare":
                bare(m.hf, m.samples)
            else:
                recs[name] = engine(m.target, m.drafter, m.samples, "walk", budgets)

    runs = {
        (w, what): partial(way, w, what) for w in cpu_bf16.POLICIES for what in ("bare", "eval")
    }
    load = load_avg()
    with torch.inference_mode():
        for run in runs.values():  # warm-up, untimed
            run()
        med = interleave(runs, args.repeats).medians()
    print(loads(load))
    for w in cpu_bf16.POLICIES:
        b, e = med[(w, "bare")]["cpu"], med[(w, "eval")]["cpu"]
        print(f"  {w:8s} bare forward {b:8.2f} CPU-s  eval {e:8.2f} CPU-s  eval / bare {e / b:.2f}")
    for what in ("bare", "eval"):
        ratio = med[("float32", what)]["cpu"] / med[("native", what)]["cpu"]
        print(f"float32 / native, {what}: {ratio:.3f}")
    pairs = list(zip(recs["native"], recs["float32"], strict=True))
    chain = sum(a["rounds"] == b["rounds"] for a, b in pairs)
    trees = sum(a["ddtree"] == b["ddtree"] for a, b in pairs)
    print(
        f"same rounds: chain {chain} of {len(pairs)} samples, DDTree {trees} of {len(pairs)} "
        "(elsewhere a bfloat16 near-tie fell the other way, as between two CPUs' kernels)"
    )
    for w in cpu_bf16.POLICIES:
        print(f"  {w:8s} tau {tau(recs[w]):.3f} token-weighted")


if __name__ == "__main__":
    main()
