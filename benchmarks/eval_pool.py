"""Samples joining the walk as others end (a pool) against batches walked one after another.

Setup: `eval_drafter_share.py`'s, cached there (a random Qwen3 target of 20 layers, hidden
256, at a 27B's shape ratios; a 5-layer block-16 drafter of about 1/4-1/5 its weights,
trained to a token-weighted tau of 3), with the same options; ``--pool`` samples walk
together at most (LOCKSTEP_SAMPLES, 16 by default).

Measured in ONE run, interleaved (median of ``--repeats``), on the same samples with the
default DDTree budgets (``--budgets``), the target computing every sample's features:

* ``batches``: consecutive batches of ``--pool`` samples, each walked to its end before
  the next begins (`remote.eval.walk.eval_batch` per batch: the engine before the pool),
  so each batch's last steps hold the blocks of its slowest samples only;
* ``pool``: `remote.eval.walk.eval_stream`, a sample joining whenever another's walks end.

Prints each one's drafter and DDTree parts (process CPU seconds, ``--clock``), its wall,
the wall until its first record (a batch's records come when the batch ends, the pool's
as each sample's walks end) and the pool / batches ratios. Both must
give the very same records but their timings and blocks drafted (DDTree rounds may move
with bf16 near-ties, and must then be identical in float32), or the script stops.

    python benchmarks/eval_pool.py [--samples 16] [--pool 4] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import eval_drafter_share as share  # noqa: E402 (benchmarks/ is on the path)
from common import load_avg  # noqa: E402


def batches(target, drafter, samples, opts, pool: int) -> tuple[list[dict], float]:
    """(records, wall seconds until the first) of `eval_batch` over each ``pool`` samples."""
    from remote.eval.walk import eval_batch

    t, first, recs = time.perf_counter(), None, []
    for a in range(0, len(samples), pool):
        recs += eval_batch(target, drafter, samples[a : a + pool], opts)
        first = first or time.perf_counter() - t
    return recs, first


def streamed(target, drafter, samples, opts) -> tuple[list[dict], float]:
    """(records, wall seconds until the first) of `eval_stream`."""
    from remote.eval.walk import eval_stream

    t, first, got = time.perf_counter(), None, {}
    for n, rec in eval_stream(target, drafter, samples, opts):
        got[n] = rec
        first = first or time.perf_counter() - t
    return [got[n] for n in range(len(samples))], first


def plain(rec: dict, ddtree: bool = True) -> dict:
    """A record but the work it took (seconds, blocks drafted: a block a tree search needs
    again after the blocks kept were full is drafted again, and how full they are depends
    on the samples walking beside it), and its DDTree rounds unless ``ddtree``."""
    skip = {"seconds", "blocks_drafted"} | (set() if ddtree else {"ddtree"})
    return {k: v for k, v in rec.items() if k not in skip}


def check_records(old: list, new: list, dirs, samples, opts, pool: int) -> list[int]:
    """Stop unless both ways gave the same records (`plain`); returns the samples
    whose DDTree rounds alone differ. In bf16 those may: a DDTree walk ranks sums of top-k
    log-probs, whose near-ties move with the other samples in a drafter call. Then both
    ways run again in float32 (``dirs``: the target's and the drafter's folders; ``pool``
    samples a batch), where every record must be identical."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    if [plain(r, False) for r in old] != [plain(r, False) for r in new]:
        sys.exit("the pool's records differ from the batches': stopping")
    moved = [
        i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b and plain(a) != plain(b)
    ]
    if moved:
        target = load_target(dirs[0], torch.float32)
        drafter, _ = load_drafter(dirs[1], torch.float32)
        a = batches(target, drafter, samples, opts, pool)[0]
        b = streamed(target, drafter, samples, opts)[0]
        if [plain(r) for r in a] != [plain(r) for r in b]:
            sys.exit("the pool's DDTree rounds differ from the batches' in float32: stopping")
    return moved


def main() -> None:
    ap = share.parser(__doc__)
    ap.add_argument("--pool", type=int, default=None, help="samples walking together at most")
    args = ap.parse_args()
    import torch

    from remote.eval import drafts, walk
    from remote.eval.device import computing
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    target_dir, drafter_dir, rows, facts = share.setup(args)
    torch.set_num_threads(args.threads)
    if args.pool:
        walk.LOCKSTEP_SAMPLES = args.pool
    pool = walk.LOCKSTEP_SAMPLES
    if args.clock == "cpu":
        drafts.CLOCK = time.process_time
    target = load_target(target_dir, torch.bfloat16)
    drafter, _report = load_drafter(drafter_dir, torch.bfloat16)
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    budgets = [int(b) for b in args.budgets.split(",") if b]
    opts = walk.WalkOptions(budgets=budgets)
    tau = facts.get("tau") or float("nan")
    print(
        f"setup: eval_drafter_share's (target 20 layers x hidden {args.hidden}, 5-layer "
        f"block-16 drafter trained to tau {tau:.2f}: {os.path.basename(drafter_dir)}); "
        f"{len(samples)} samples, pool {pool}; DDTree budgets {args.budgets or 'none'}; "
        f"threads {args.threads}; parts in {args.clock} seconds"
    )
    runs = {
        "batches": lambda: batches(target, drafter, samples, opts, pool),
        "pool": lambda: streamed(target, drafter, samples, opts),
    }
    before = load_avg()
    times: dict = {name: {} for name in runs}
    recs: dict = {}
    with computing(torch.device("cpu")):  # bf16 products as the eval computes them here
        streamed(target, drafter, samples[:pool], opts)  # warm-up: one-off costs not counted
        for r in range(args.repeats):
            for name in runs if r % 2 == 0 else list(runs)[::-1]:
                t = time.perf_counter()
                recs[name], first = runs[name]()
                got = times[name]
                got.setdefault("wall", []).append(time.perf_counter() - t)
                got.setdefault("first", []).append(first)
                for part in ("drafter", "ddtree"):
                    got.setdefault(part, []).append(sum(x["seconds"][part] for x in recs[name]))
        moved = check_records(
            recs["batches"], recs["pool"], (target_dir, drafter_dir), samples, opts, pool
        )
    print(f"load average (1, 5, 15 min): {before} before, {load_avg()} after")

    med = {n: {k: statistics.median(v) for k, v in got.items()} for n, got in times.items()}
    same = "identical" if not moved else f"identical but DDTree rounds of samples {moved}"
    print(f"median of {args.repeats} interleaved rounds; records {same}")
    print("  seconds      drafter   DDTree  drafter+DDTree     wall  first record")
    for name in runs:
        m = med[name]
        print(
            f"  {name:<10} {m['drafter']:8.3f} {m['ddtree']:8.3f} "
            f"{m['drafter'] + m['ddtree']:15.3f} {m['wall']:8.3f} {m['first']:13.3f}"
        )
    new, old = med["pool"], med["batches"]
    print(
        f"  pool / batches: drafter {new['drafter'] / old['drafter']:.3f}, drafter+DDTree "
        f"{(new['drafter'] + new['ddtree']) / (old['drafter'] + old['ddtree']):.3f}, wall "
        f"{new['wall'] / old['wall']:.3f}, first record {new['first'] / old['first']:.3f}"
    )


if __name__ == "__main__":
    main()
