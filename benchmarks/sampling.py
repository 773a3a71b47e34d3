"""What does tau at a temperature above 0 cost against the greedy eval, and a sweep per
added temperature?

Setup: the trained pair (`common.pair`, as feature_cache.py uses it, same options); the
greedy ground truth is the pair's samples, the sampled one the same prompts completed by
the target at each temperature (transformers' generate, seeded, the same length). Each
eval is `remote.eval.engine.run_eval` (what an eval job runs) with the chain walk only
(no DDTree budgets), its ``--threads``; figures are the process's CPU seconds
(`resource.getrusage`: user + system, every thread), a shared box's wall being noisy.

Measured in ONE run, ``--repeats`` rounds (medians):

* (a) with the target's features cached (each ground truth's entry made by an untimed
  eval first): the eval at T=1, argmax drafts, over the T=1 ground truth / the greedy
  eval over the greedy one, for ``--positions walk`` and ``--positions all``. Goal <= 1.2.
* (b) a sweep as `remote-eval --temperature 0,0.6,1.0` runs it: one eval per temperature
  over its own ground truth on an empty cache (the ground truths made beforehand, as a
  server makes them); sweeps of 1, 2 and 3 temperatures, the CPU per added temperature /
  the sweep of one. And one ground truth at 1, 2, 3 temperatures (a ground-truth file
  evaluated at several): the added temperatures served from the feature cache.

    python benchmarks/sampling.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
from dataclasses import replace

from common.measure import goal, load_avg, loads
from common.pair import parser, setup

from remote.protocol import JOB_ENGINE_DEFAULT

SWEEP = (0.0, 0.6, 1.0)


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def sampled_rows(target_dir: str, rows: list[dict], t: float, seed: int = 0) -> list[dict]:
    """`rows`' prompts completed by the target sampled at `t` (seeded per prompt), as long."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    out = []
    for i, r in enumerate(rows):
        torch.manual_seed(seed * 1000 + i)
        n = len(r["completion_ids"])
        x = torch.tensor([r["prompt_ids"]])
        with torch.inference_mode():
            ids = hf.generate(
                x, attention_mask=torch.ones_like(x), do_sample=True, temperature=t, top_k=0,
                max_new_tokens=n, min_new_tokens=n,
            )  # fmt: skip
        out.append({**r, "id": f"{r['id']}@{t:g}", "completion_ids": ids[0, x.shape[1] :].tolist()})
    return out


def write(rows: list[dict], path: str) -> str:
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def one_eval(spec, gt: str, t: float, out: str, cache) -> tuple[float, dict]:
    """One `run_eval` at temperature `t` over `gt`: its CPU seconds and result."""
    from remote.eval.engine import run_eval

    start = cpu()
    result = run_eval(
        replace(spec, ground_truth=gt, temperature=t, output_dir=out),
        on_event=lambda e: None,
        features=cache,
    )
    return cpu() - start, result


def tau(result: dict) -> float:
    exp = result.get("expected")
    return exp["tau_token_weighted"] if exp else result["metrics"]["tau_token_weighted"]


def main() -> None:
    ap = parser(__doc__)
    ap.set_defaults(threads=1, repeats=3)
    args = ap.parse_args()
    import torch

    from remote.eval.feature_cache import FeatureCache

    target_dir, drafter, rows, facts = setup(args)
    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="dflash-bench-sampling-")
    gts = {0.0: write(rows, os.path.join(work, "gt-0.jsonl"))}
    for t in SWEEP[1:]:
        gts[t] = write(sampled_rows(target_dir, rows, t), os.path.join(work, f"gt-{t:g}.jsonl"))
    spec = replace(
        JOB_ENGINE_DEFAULT,
        target=target_dir,
        drafter=drafter,
        dtype="bfloat16",
        threads=args.threads,
        budgets=(),
    )
    tokens = sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    print(
        f"setup: the trained pair (target hidden {args.hidden}, drafter trained to tau "
        f"{facts.get('tau') or float('nan'):.2f}); {len(rows)} samples, {tokens} tokens; "
        f"chain walk, no DDTree; threads {args.threads}; CPU seconds of this process"
    )
    n = 0

    def out() -> str:
        nonlocal n
        n += 1
        return os.path.join(work, f"e{n}")

    one_eval(spec, gts[0.0], 0.0, out(), None)  # first calls pay one-off costs: not counted
    before = load_avg()
    ratios: dict[str, list[float]] = {"walk": [], "all": []}
    taus = {}
    for positions in ratios:
        at = replace(spec, positions=positions)
        cache = FeatureCache(os.path.join(work, f"features-{positions}"), 2**30)
        for t in (0.0, 1.0):  # each ground truth's features made and kept: not counted
            one_eval(at, gts[t], t, out(), cache)
        for _ in range(args.repeats):
            greedy, g = one_eval(at, gts[0.0], 0.0, out(), cache)
            hot, h = one_eval(at, gts[1.0], 1.0, out(), cache)
            assert g["inputs"]["target_features"]["cached"], "greedy eval not served by cache"
            assert h["inputs"]["target_features"]["cached"], "T=1 eval not served by cache"
            ratios[positions].append(hot / greedy)
            taus[positions] = (tau(g), tau(h), greedy, hot, g["timings"], h["timings"])
    for positions, got in ratios.items():
        g_tau, h_tau, g_s, h_s, g_t, h_t = taus[positions]
        print(
            f"  positions {positions}: greedy {g_s:.3f} CPU-s (tau {g_tau:.2f}), T=1 argmax "
            f"{h_s:.3f} CPU-s (expected tau {h_tau:.2f}); engine's walk, wall s: greedy "
            f"{g_t['eval_s']:.3f} (drafter {g_t['drafter_s']:.3f}), T=1 {h_t['eval_s']:.3f} "
            f"(drafter {h_t['drafter_s']:.3f}; the rest is the expectation)"
        )
        goal(f"(a) positions {positions}: T=1 / greedy, cached features", statistics.median(got),
             "<=", 1.2, digits=3)  # fmt: skip

    def sweep(temps, own: bool) -> float:
        """CPU of evaluating at `temps` on an empty cache: each over its own ground truth
        (`own`), else all over the greedy one's prompts sampled at T=1."""
        cache = FeatureCache(tempfile.mkdtemp(dir=work), 2**30)
        return sum(one_eval(spec, gts[t] if own else gts[1.0], t, out(), cache)[0] for t in temps)

    for own, label in ((True, "own ground truth per T"), (False, "one ground truth, cached")):
        per = {k: [] for k in (1, 2, 3)}
        for _ in range(args.repeats):
            for k in per:
                per[k].append(sweep(SWEEP[:k], own))
        med = {k: statistics.median(v) for k, v in per.items()}
        added = (med[3] - med[1]) / 2 / med[1]
        print(
            f"(b) sweep, {label}: 1 T {med[1]:.3f}, 2 T {med[2]:.3f}, 3 T {med[3]:.3f} CPU-s; "
            f"per added T / one eval = {added:.3f}"
        )
    print(loads(before))


if __name__ == "__main__":
    main()
