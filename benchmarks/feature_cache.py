"""What does a checkpoint's eval cost once another's kept the target's features?

Setup: the trained 27B-shaped pair (`common.pair`, as `eval_drafter_share.py` uses it, with
the same options; its drafter's checkpoints every ``--save-every`` steps). Each eval is
`remote.eval.engine.run_eval`, the library function an eval job runs, with the job's default
engine settings (DDTree at the default budgets) and its ``--threads``; ``eval`` is the
engine's walk over the samples (its ``timings.eval_s``: target features, drafter, DDTree), a
checkpoint's ``drafter part`` its drafter and DDTree seconds (what depends on the
checkpoint).

Measured in ONE run, ``--repeats`` rounds (medians), each round with an empty cache:

* ``follow`` over three checkpoints A, B, C (the training's last three), measured as what
  each follow step's job runs: three consecutive evals through the library function on
  one empty cache (not over SSH: a job's python start, imports and target load are the
  same with or without the cache and would only dilute the ratio). A runs cold (the
  target's forward, its features kept), B and C warm (read back). Goals: B warm's eval
  <= 1.1 x its own drafter part; the three evals together <= (one target forward + their
  three drafter parts) x 1.1;
* B again without the cache: the reference (after one untimed warm-up eval). Its rounds
  must equal the warm eval's, sample by sample, or the script stops; its target part is
  the "one target forward".
* the same two ratios over whole `run_eval` walls (checks, loads, walk, round costs,
  results): a warm eval loads only the target's embedding and head and reads the target's
  round costs back, so what it costs beyond its drafter part is what stays: the drafter's
  load and its round timing. The script stops unless B and C warm loaded the ends alone.

Prints each eval's parts, the ratios and the load average (the ratios move with it on a
shared box).

    python benchmarks/feature_cache.py [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import replace

from common.measure import goal, load_avg, loads
from common.pair import budget_list, parser, setup

from remote.protocol import JOB_ENGINE_DEFAULT


def checkpoints(chosen: str, n: int) -> list[str]:
    """The last `n` checkpoints (by step) of the training that made `chosen`, up to it."""
    folder = os.path.dirname(chosen)
    steps = sorted(
        (int(name.split("-")[1]), os.path.join(folder, name))
        for name in os.listdir(folder)
        if name.startswith("step-")
    )
    upto = [path for step, path in steps if step <= int(os.path.basename(chosen).split("-")[1])]
    if len(upto) < n:
        raise SystemExit(f"{folder} has {len(upto)} checkpoints, {n} needed")
    return upto[-n:]


def one_eval(spec, drafter: str, out: str, cache) -> dict:
    """One `run_eval` of `drafter`: its parts (s), wall (s), target_features and records."""
    from remote.eval.engine import run_eval

    t = time.perf_counter()
    result = run_eval(
        replace(spec, drafter=drafter, output_dir=out), on_event=lambda e: None, features=cache
    )
    wall = time.perf_counter() - t
    tm = result["timings"]
    with open(os.path.join(out, "samples.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    return {
        "eval": tm["eval_s"],
        "target": tm["target_forward_s"],
        "drafter": tm["drafter_s"] + tm["ddtree_s"],
        "wall": wall,
        "load": tm["load_target_s"],
        "costs": tm["round_costs"].get("target_costs"),
        "features": result["inputs"]["target_features"],
        "records": records,
    }


def same_rounds(a: list[dict], b: list[dict]) -> bool:
    keys = ("rounds", "ddtree", "agreement", "position_attempts", "position_hits")
    return [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def one_round(spec, ckpts: list[str], work: str) -> dict:
    """``follow`` over the three checkpoints on an empty cache (the first is A cold, the
    second B warm), then B without the cache."""
    from remote.eval.feature_cache import FeatureCache

    cache = FeatureCache(os.path.join(work, "features"), 2**30)
    got = {}
    for n, ckpt in enumerate(ckpts):
        label = ("A cold", "B warm", "C warm")[n]
        got[label] = one_eval(spec, ckpt, os.path.join(work, f"f{n}"), cache)
    got["B no cache"] = one_eval(spec, ckpts[1], os.path.join(work, "b-none"), None)
    if not same_rounds(got["B warm"]["records"], got["B no cache"]["records"]):
        raise SystemExit("the eval from cached features gives other rounds than without")
    assert not got["A cold"]["features"]["cached"]
    assert got["B warm"]["features"]["cached"] and got["C warm"]["features"]["cached"]
    for name in ("B warm", "C warm"):  # every feature and the target's costs cached
        assert got[name]["features"]["target_loaded"] == "embedding_and_head", got[name]
        assert got[name]["costs"] == "cached", got[name]["costs"]
    return got


def weight_bytes(target_dir: str) -> tuple[int, int]:
    """(bytes of the target's text weights, bytes an eval with every feature cached loads:
    its embedding and head), bf16."""
    import torch

    from remote.eval.target import describe, load_target, text_weight_bytes

    _cfg, meta, info = describe(target_dir)
    whole = text_weight_bytes(meta, info, torch.bfloat16)
    ends = load_target(target_dir, torch.bfloat16, ends_only=True)
    seen, got = set(), 0
    for p in ends.model.parameters():
        if not p.is_meta and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            got += p.numel() * p.element_size()
    return whole, got


def main() -> None:
    args = parser(__doc__).parse_args()
    import torch

    target_dir, chosen, rows, facts = setup(args)
    ckpts = checkpoints(chosen, 3)
    torch.set_num_threads(args.threads)
    whole_bytes, ends_bytes = weight_bytes(target_dir)
    budgets = tuple(budget_list(args))
    work = tempfile.mkdtemp(prefix="dflash-bench-feature-cache-")
    gt = os.path.join(work, "gt.jsonl")
    with open(gt, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    spec = replace(
        JOB_ENGINE_DEFAULT,
        target=target_dir,
        ground_truth=gt,
        dtype="bfloat16",
        threads=args.threads,
        budgets=budgets,
    )
    tokens = sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    print(
        f"setup: the 27B-shaped pair (target 20 layers x hidden {args.hidden}, 5-layer block-16 "
        f"drafter trained to tau {facts.get('tau') or float('nan'):.2f}); {len(rows)} samples, "
        f"{tokens} tokens; positions {spec.positions}; DDTree budgets "
        f"{','.join(map(str, budgets)) or 'none'}; threads {args.threads}"
    )
    print("checkpoints A, B, C: " + ", ".join(os.path.basename(c) for c in ckpts))

    t = time.perf_counter()  # first calls pay one-off costs (kernels, allocator): not counted
    one_eval(replace(spec, max_samples=1), ckpts[0], os.path.join(work, "warm-up"), None)
    print(f"warm-up eval (1 sample, not counted): {time.perf_counter() - t:.1f} s")
    before = load_avg()
    rounds = []
    for r in range(args.repeats):
        t = time.perf_counter()
        rounds.append(one_round(spec, ckpts, os.path.join(work, f"r{r}")))
        print(f"  round {r + 1}: {time.perf_counter() - t:.1f} s (load {load_avg()})", flush=True)
    print(loads(before))
    for name, ckpt in zip(("A cold", "B warm", "C warm"), ckpts, strict=True):
        recs = rounds[0][name]["records"]
        tau = sum(sum(r["rounds"]) for r in recs) / sum(len(r["rounds"]) for r in recs)
        print(f"  {os.path.basename(ckpt)}: tau {tau:.2f} token-weighted")

    def med(name: str, part: str) -> float:
        return statistics.median(rd[name][part] for rd in rounds)

    print(
        f"  seconds (median of {args.repeats})   target  drafter part     eval   run_eval wall"
        "   target load  target loaded"
    )
    for name in rounds[0]:
        print(
            f"  {name:<26} {med(name, 'target'):7.3f}  {med(name, 'drafter'):12.3f}  "
            f"{med(name, 'eval'):7.3f}  {med(name, 'wall'):14.3f}  {med(name, 'load'):12.3f}"
            f"  {rounds[0][name]['features']['target_loaded']}"
        )
    warm = statistics.median(rd["B warm"]["eval"] / rd["B warm"]["drafter"] for rd in rounds)
    goal("B warm: eval / its drafter part", warm, "<=", 1.1, digits=3)
    whole = statistics.median(rd["B warm"]["wall"] / rd["B warm"]["drafter"] for rd in rounds)
    none = statistics.median(
        rd["B no cache"]["wall"] / rd["B no cache"]["drafter"] for rd in rounds
    )
    print(
        f"B warm: the whole run_eval (checks, loads, walk, round costs, results) / its drafter "
        f"part = {whole:.3f}   (the goal read strictly: <= 1.1; without the cache {none:.3f})"
    )
    load = statistics.median(rd["B warm"]["load"] / rd["B no cache"]["load"] for rd in rounds)
    print(
        f"B warm's target load / B without the cache's = {load:.3f}; weights read "
        f"{ends_bytes / 2**20:.1f} of {whole_bytes / 2**20:.1f} MiB "
        f"({ends_bytes / whole_bytes:.3f}: the embedding and head)"
    )

    def follow_ratio(rd: dict) -> float:
        steps = [rd[name] for name in ("A cold", "B warm", "C warm")]
        bound = rd["B no cache"]["target"] + sum(s["drafter"] for s in steps)
        return sum(s["eval"] for s in steps) / bound

    ratio = statistics.median(follow_ratio(rd) for rd in rounds)
    goal(
        "follow over 3: evals / (one target forward + 3 drafter parts)", ratio, "<=", 1.1, digits=3
    )

    def follow_walls(rd: dict) -> float:
        # One whole cold eval (its load, forward, costs and drafter part) and two more
        # drafter parts: what three follow steps would cost if only the drafter changed.
        bound = rd["B no cache"]["wall"] + rd["A cold"]["drafter"] + rd["C warm"]["drafter"]
        return sum(rd[name]["wall"] for name in ("A cold", "B warm", "C warm")) / bound

    walls = statistics.median(follow_walls(rd) for rd in rounds)
    label = "follow over 3, whole run_evals: walls / (one eval without the cache + 2 drafter parts)"
    goal(label, walls, "<=", 1.1, digits=3)
    cold = statistics.median(rd["A cold"]["target"] / rd["B no cache"]["target"] for rd in rounds)
    print(
        f"A cold's target part (features computed and kept) / a target part without the "
        f"cache = {cold:.3f}   (what keeping them costs)"
    )


if __name__ == "__main__":
    main()
