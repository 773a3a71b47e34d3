"""What does the eval's drafter part cost at a 27B's proportions, drafting only where rounds
start, against drafting at every completion position?

Setup: the trained 27B-shaped pair (`common.pair`: a 20-layer hidden-256 Qwen3 target at
Qwen3.6-27B's shape ratios, 39 MB in bf16; a 5-layer block-16 drafter trained on it to a
token-weighted tau of ``--tau``, 3), cached under ``--workdir`` (default
``~/.cache/dflash/bench-drafter-share``), so a rerun measures without retraining.

Measured in ONE run, rounds interleaved (median of ``--repeats``), on the same samples,
with the DDTree budgets (``--budgets``) and again without (the chain walk only):

* ``all``: the engine drafting a block at every completion position, one sample at a time
  (``positions="all"``, the engine before round-starts-only drafting; opt-in now);
* ``walk``: the default, blocks only where the chain walk and each DDTree budget's walk
  start rounds, all walks of the samples in lockstep (`remote.eval.walk.Lockstep`,
  `remote.eval.walk.eval_stream`);
* ``before``: the engine as #29 found it (``--before``, default b4dc523, the parent of the
  first commit drafting only where rounds start), checked out as a git worktree and run in
  a child process importing its ``remote/`` (`common.baseline`): a block at every
  completion position, one sample at a time; its chain rounds must be today's;
* a bare transformers forward of the target over each sample (full logits).

The parts are timed in process CPU seconds (``--clock cpu``, the default: on a shared
machine wall time moves with the other processes' load) or wall seconds (``--clock wall``);
wall and CPU totals are printed either way. With more than one thread the CPU clock counts
the threads' spinning too, which small drafter calls pay for more: ``--threads 1`` is the
cleanest comparison of the work done.

Prints each part (target, drafter, DDTree, total) of each, the drafter's share of each
eval, the ratio of the drafter parts (goal <= 1.3 / tau, token-weighted: against
``before`` and against ``all``, which has since had the walk's other speed-ups), the floor
under it (the union of the walks' round starts, which any exact walk drafts, and the
cost of a walk block against an all-positions block that the goal then asks for; and,
per number of DDTree budgets kept, the subset of them with the lowest floor), eval /
bare target forward before and after, the blocks drafted, and the machine's load average
(the ratios move with it on a shared box). Both modes must give the very same rounds, and the
same DDTree rounds but where bf16 near-ties move them (in the all-positions engine too,
or not in float32: `check_rounds`); the script stops if not.

    python benchmarks/eval_drafter_share.py [--repeats 5] [--threads 2] [--budgets 8,16,32,64]
        [--clock cpu|wall] [--hidden 256] [--before REV|none]
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from functools import partial

from common.baseline import ENGINE_29, NoRevision, earlier_engine, worktree
from common.measure import interleave, load_avg, loads
from common.models import head_share
from common.pair import bare, budget_list, engine, loaded, parser

from remote.eval.metrics import round_starts


def timed_modes(m, budget_sets, repeats: int, before=None):
    """Per mode (``all`` and ``walk`` with each of ``budget_sets``; and ``before``, the
    earlier engine, where ``before`` (`earlier_engine` but for the budgets) is given) and
    the bare forward, interleaved rounds of wall and CPU time and parts; the records of the
    last round. Every mode computes its bf16 products as the eval does on this CPU."""
    import torch

    from remote.eval.device import computing

    recs: dict = {}

    def run(mode: str, budgets: tuple) -> dict:
        if mode == "before":
            got = before(budgets)  # its child's timed pass, not its start and loads
            recs[(mode, budgets)] = got["records"]
            spent = {"wall": got["wall"], "cpu": got["cpu"]}
        else:
            recs[(mode, budgets)] = engine(m.target, m.drafter, m.samples, mode, list(budgets))
            spent = {}
        parts = ("target", "drafter", "ddtree")
        return spent | {k: sum(r["seconds"][k] for r in recs[(mode, budgets)]) for k in parts}

    names = ("all", "walk") if before is None else ("before", "all", "walk")
    modes = {"bare": partial(bare, m.hf, m.samples)}
    modes |= {(n, tuple(b)): partial(run, n, tuple(b)) for b in budget_sets for n in names}
    with torch.inference_mode(), computing(torch.device("cpu")):
        bare(m.hf, m.samples)  # warm-up of both
        engine(m.target, m.drafter, m.samples, "walk", list(budget_sets[0]))
        got = interleave(modes, repeats)
    return got.medians(), recs


OTHER_CHUNK = 7  # blocks per drafter call unlike any default (`auto_chunk` gives 16 or more)


def check_rounds(dirs, target, drafter, samples, budgets, old: list, new: list) -> None:
    """Stop unless both modes gave the same rounds. The chain walk's must be identical. In
    bf16 a DDTree walk may not be: its best-first order ranks sums of top-k log-probs,
    whose near-ties move with a batch's shape (the all-positions engine itself, drafting
    in other chunks, gives other DDTree rounds there). Such samples are printed, and each
    must also differ between the all-positions engine at its default chunk and at
    `OTHER_CHUNK`, or else have the same DDTree rounds in both modes in float32 (``dirs``:
    the target's and the drafter's folders, loaded in float32 for it; the walk over every
    sample, as it ran, so the samples walking beside each are the same): otherwise the
    difference is the walk's and the run stops. (This script measures bf16 only.)"""
    from remote.eval.walk import WalkOptions, eval_batch

    moved, unexplained = [], []
    for i, (a, w) in enumerate(zip(old, new, strict=True)):
        if a["rounds"] != w["rounds"]:
            raise SystemExit(f"sample {i}: the walk's rounds differ from the engine's")
        if a["ddtree"] != w["ddtree"]:
            other = WalkOptions(budgets=list(budgets), positions="all", block_chunk=OTHER_CHUNK)
            moved.append(i)
            if eval_batch(target, drafter, [samples[i]], other)[0]["ddtree"] == a["ddtree"]:
                unexplained.append(i)
    if unexplained:
        import torch

        from remote.eval.drafter import load_drafter
        from remote.eval.target import load_target

        target32 = load_target(dirs[0], torch.float32)
        drafter32, _ = load_drafter(dirs[1], torch.float32)
        walked = eval_batch(target32, drafter32, samples, WalkOptions(budgets=list(budgets)))
        every = WalkOptions(budgets=list(budgets), positions="all")
        for i in unexplained:
            if (
                eval_batch(target32, drafter32, [samples[i]], every)[0]["ddtree"]
                != walked[i]["ddtree"]
            ):
                raise SystemExit(f"sample {i}: the walk's DDTree rounds differ from the engine's")
    if moved:
        print(
            f"DDTree {','.join(map(str, budgets))}: samples {moved} have other DDTree rounds "
            "in the two modes in bf16 (near-ties: as in the all-positions engine at another "
            f"chunk{'' if not unexplained else f', or the same in float32 for {unexplained}'})"
        )


def check_before(before: list, new: list, budgets: tuple) -> None:
    """Stop unless the earlier engine's chain rounds are today's; say on how many samples
    its DDTree rounds are (bf16 near-ties move them, as `check_rounds` says)."""
    for i, (b, w) in enumerate(zip(before, new, strict=True)):
        if b["rounds"] != w["rounds"]:
            raise SystemExit(f"sample {i}: the earlier engine's rounds differ from the walk's")
    same = sum(b["ddtree"] == w["ddtree"] for b, w in zip(before, new, strict=True))
    if budgets and same < len(new):
        print(
            f"DDTree {','.join(map(str, budgets))}: the earlier engine's DDTree rounds are "
            f"the walk's on {same} of {len(new)} samples (bf16 near-ties)"
        )


def print_setup(args, target_dir: str, drafter, report, samples, budgets, facts) -> None:
    """What was measured: the two models' shapes and sizes, the samples, the drafter's
    training."""
    import torch

    from remote.eval.target import describe, text_weight_bytes

    _c, meta, info = describe(target_dir)
    t_bytes = text_weight_bytes(meta, info, torch.bfloat16)
    d_bytes = report.parameters * 2
    tokens = sum(len(p) + len(c) for p, c in samples)
    print(
        f"setup: target Qwen3 {info.num_layers} layers, hidden {info.hidden_size}, vocab "
        f"{info.vocab_size} (head {100 * head_share(target_dir):.1f}% of its weights): "
        f"{t_bytes / 2**20:.0f} MiB bf16; drafter {drafter.cfg.num_layers} layers, block "
        f"{drafter.block_size}: {d_bytes / 2**20:.1f} MiB = 1/{t_bytes / d_bytes:.1f} of the "
        f"target; {len(samples)} samples x ({args.prompt} prompt + {args.completion} "
        f"completion) = {tokens} tokens; threads {args.threads}; DDTree budgets "
        f"{','.join(map(str, budgets)) or 'none'}"
    )
    took = "" if facts["train_s"] is None else f", in {facts['train_s']:.0f} s"
    print(
        f"drafter: {facts['drafter']}, trained on {args.train_samples} samples, these "
        f"{len(samples)} among them{took}"
    )


def walks_starts(rec: dict, budgets: tuple | None = None) -> set[int]:
    """Where the chain walk and each DDTree budget's walk of one record (of ``budgets``
    only, when given) start rounds: the blocks any exact walk must draft."""
    trees = [r for n, r in rec["ddtree"].items() if budgets is None or int(n) in budgets]
    return {s for r in (rec["rounds"], *trees) for s in round_starts(rec["prompt_tokens"], r)}


def print_floors(recs: list[dict], budgets: tuple, positions: int, goal: float) -> None:
    """Per number of DDTree budgets kept, the subset of ``budgets`` with the lowest floor
    (its walks' round starts / ``positions``) and the walk block's cost the goal then asks
    for: which default budget sets the goal admits."""
    best = []
    for n in range(len(budgets) + 1):
        floors = {
            kept: sum(len(walks_starts(r, kept)) for r in recs) / positions
            for kept in itertools.combinations(budgets, n)
        }
        kept = min(floors, key=floors.get)
        name = ",".join(map(str, kept)) or "chain only"
        best.append(f"{name} {floors[kept]:.3f} (<= {goal / floors[kept]:.2f}x)")
    print(f"  floor by budgets kept, the lowest of each count: {'; '.join(best)}")


def print_parts(med: dict, recs: dict, budgets: tuple, clock: str, rev: str | None) -> None:
    """The parts of both modes (and of ``rev``'s engine, where measured) with ``budgets``,
    the drafter's share of each eval, and the new / old ratios."""
    old, new, first = ("all", budgets), ("walk", budgets), ("before", budgets)
    who = "#29's engine" if rev == ENGINE_29 else f"{rev}'s engine"
    rounds = [r["rounds"] for r in recs[new]]
    tau = sum(map(sum, rounds)) / sum(map(len, rounds))
    per_sample = statistics.mean(sum(r) / len(r) for r in rounds)
    print(
        f"DDTree budgets {','.join(map(str, budgets)) or 'none (the chain walk only)'}: tau "
        f"{tau:.2f} token-weighted, {per_sample:.2f} per-sample mean; "
        f"{sum(map(len, rounds))} rounds"
    )
    blocks = {m: sum(r["blocks_drafted"] for r in recs[m]) for m in (old, new)}
    chain = {m: sum(r["positions_drafted"] for r in recs[m]) for m in (old, new)}
    print(
        f"  seconds (median, parts {clock})  target  drafter   DDTree     wall  (CPU s)  "
        "drafter share  blocks"
    )
    rows = [(old, "all positions (old)"), (new, "round starts (new)")]
    if rev is not None:  # it counts no blocks; it drafts one at every position
        blocks[first] = blocks[old]
        rows.insert(0, (first, f"{who} ({rev[:7]})"))
    for m, label in rows:
        t = med[m]
        parts = t["target"] + t["drafter"] + t["ddtree"]
        print(
            f"  {label:<29} {t['target']:7.2f}  {t['drafter']:7.2f}  {t['ddtree']:7.2f}  "
            f"{t['wall']:7.2f}  ({t['cpu']:5.1f})  {t['drafter'] / parts:13.3f}  "
            f"{blocks[m]:6d}"
        )
    bare = med["bare"]
    print(f"  bare target forward           {bare['wall']:7.2f} wall, {bare['cpu']:.2f} CPU s")
    if rev is not None:
        then = med[new]["drafter"] / med[first]["drafter"]
        print(
            f"  new drafter part / {who}'s = {then:.3f}   (goal <= 1.3 / tau = "
            f"{1.3 / tau:.3f}: {'met' if then <= 1.3 / tau else 'NOT met'}; the all-positions "
            f"mode of today / {who}'s = "
            f"{med[old]['drafter'] / med[first]['drafter']:.3f})"
        )
    share = med[new]["drafter"] / med[old]["drafter"]
    met = "met" if share <= 1.3 / tau else "NOT met"
    print(
        f"  new drafter part / old drafter part = {share:.3f}   (goal <= 1.3 / tau = "
        f"{1.3 / tau:.3f}: {met}; blocks {blocks[new] / blocks[old]:.3f}, chain "
        f"acceptances drafted (look-ahead included) / positions {chain[new] / chain[old]:.3f})"
    )
    # Rounds start where the previous round's acceptance says, so no exact walk drafts
    # fewer blocks than the union of its walks' round starts.
    floor = sum(len(walks_starts(r)) for r in recs[new]) / blocks[old]
    print(
        f"  floor: every walk's round starts / positions = {floor:.3f}; the goal needs a "
        f"walk block at <= {1.3 / tau / floor:.2f}x an all-positions block's cost (measured "
        f"{share / (blocks[new] / blocks[old]):.2f}x)"
    )
    if budgets:
        print_floors(recs[new], budgets, blocks[old], 1.3 / tau)
    if med[old]["ddtree"]:
        tree = med[new]["ddtree"] / med[old]["ddtree"]
        both = (med[new]["drafter"] + med[new]["ddtree"]) / (
            med[old]["drafter"] + med[old]["ddtree"]
        )
        print(f"  new DDTree part / old DDTree part   = {tree:.3f}; drafter + DDTree {both:.3f}")
    key = "cpu" if clock == "cpu" else "wall"
    if rev is not None:
        print(
            f"  eval / bare target forward ({key}), {who}: "
            f"{med[first][key] / bare[key]:.2f}   (new eval / its = "
            f"{med[new][key] / med[first][key]:.3f})"
        )
    print(
        f"  eval / bare target forward ({key}): before {med[old][key] / bare[key]:.2f}, "
        f"after {med[new][key] / bare[key]:.2f}   "
        f"(new eval / old eval = {med[new][key] / med[old][key]:.3f}; wall "
        f"{med[new]['wall'] / med[old]['wall']:.3f})"
    )


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument(
        "--before",
        default=ENGINE_29,
        help="also measure this commit's engine (default: the engine as #29 found it); "
        "'none': do not",
    )
    args = ap.parse_args()
    import torch

    from remote.eval.device import computing

    budgets = budget_list(args)
    m = loaded(args)
    print_setup(args, m.target_dir, m.drafter, m.report, m.samples, budgets, m.facts)
    budget_sets = [tuple(budgets), ()] if budgets else [()]
    if args.clock == "cpu":
        from remote.eval import drafts

        drafts.CLOCK = time.process_time
    dirs = (m.target_dir, m.drafter_dir)
    with ExitStack() as stack:
        before = None
        try:
            tree = None if args.before == "none" else stack.enter_context(worktree(args.before))
        except NoRevision as e:  # e.g. a shallow clone: measure today's modes alone
            print(e)
            tree = None
        if tree is not None:
            path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "s.json")
            with open(path, "w") as fh:
                json.dump(m.samples, fh)
            before = partial(earlier_engine, tree, dirs, path, args.threads, args.clock)
        load = load_avg()
        med, recs = timed_modes(m, budget_sets, args.repeats, before)
    print(f"{loads(load)}; median of {args.repeats} interleaved rounds")
    for b in budget_sets:
        with computing(torch.device("cpu")):  # as the rounds were walked
            check_rounds(
                dirs, m.target, m.drafter, m.samples, b, recs[("all", b)], recs[("walk", b)]
            )
        if before is not None:
            check_before(recs[("before", b)], recs[("walk", b)], b)
    for b in budget_sets:
        print_parts(med, recs, b, args.clock, None if before is None else args.before)


if __name__ == "__main__":
    main()
