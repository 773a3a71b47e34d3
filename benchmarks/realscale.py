"""How close does a 27B eval come to this CPU's own speed, part by part?

Setup (`common.realwidth`, built once under ``--workdir``, default
``~/.cache/dflash/bench-realscale``): Qwen3.6-27B's published text config (hidden 5120,
24 / 4 heads of 256, Gated DeltaNet keys 16 x 128 and values 48 x 128, MLP 17408, untied
vocabulary 248320) cut to its first ``--layers`` layers (4: one period of 3 linear + 1
full), bf16, random weights; real-width DFlash drafters of 1 and 2 layers; ``--samples``
random samples of ``--prompt`` + ``--completion`` tokens (a random drafter: tau 1).

Measured in ONE run, each part in a fresh child (one model at a time; the benchmark's
peak RSS is its largest child's), the page cache warmed first so every load reads the
same cached pages:

* the GEMM bound: bf16 ``F.linear`` of every matrix of each layer kind and of the head,
  at the rows a forward gives it (the floor of the target's forward);
* transformers: ``from_pretrained``, its first forward (the page-in) and a bare forward
  per sample with ``output_hidden_states=True`` (what a hand-written harness does);
* the engine: its load and first forward, its forward per sample with each decoder layer
  timed, each drafter's walk over those features (drafter and DDTree parts);
* the product: ``python -m remote eval`` with the 2-layer drafter and the default DDTree
  budgets, its parts from its result (target, drafter, DDTree, round costs) and its peak RSS.

Composed to Qwen3.6-27B's 64 layers (16 x [3 linear + 1 full]) and a 5-layer drafter
(the 2-layer drafter's part plus 3 times what its first layer adds), and, with the
trained tiny pair of `common.pair` where it is cached (``--pair-samples``, 64: what
``eval_drafter_share.py --samples 64 --train-samples 64`` trains), to that drafter's
block counts at its trained tau. Prints every ratio, each goal met or not, the load
average, and last
``realscale: target/bound X; linear/full Y; load/transformers Z; round costs W%; ...``.

    python benchmarks/realscale.py [--layers 4] [--samples 4] [--prompt 128]
        [--completion 256] [--threads 2] [--repeats 2] [--from-run LAST-RUN.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from common.measure import goal, load_avg, loads, run_child
from common.realwidth import build, linear_shapes, samples, text_config

CHILD = "import sys; sys.path.insert(0, 'benchmarks'); from common.realwidth import child; "
CHILD += "child(sys.argv[1:])"
REAL_LAYERS = {"linear_attention": 48, "full_attention": 16}  # Qwen3.6-27B's 64
REAL_DRAFTER_LAYERS = 5


def parse() -> argparse.Namespace:
    from remote.protocol import DEFAULT_BUDGETS

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default=os.path.expanduser("~/.cache/dflash/bench-realscale"))
    ap.add_argument("--layers", type=int, default=4, help="target layers, 2-4 (both kinds)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--completion", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes (best of)")
    ap.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)))
    ap.add_argument(
        "--from-run",
        metavar="JSON",
        help="report the figures a run kept (its --workdir's last-run.json) without measuring",
    )
    ap.add_argument(
        "--pair-workdir",
        default=os.path.expanduser("~/.cache/dflash/bench-drafter-share"),
        help="where common.pair caches its trained tiny pair (its block counts)",
    )
    ap.add_argument(
        "--pair-samples",
        type=int,
        default=64,
        help="the trained pair's samples, trained on and walked (eval_drafter_share's "
        "--samples N --train-samples N)",
    )
    args = ap.parse_args()
    if not 2 <= args.layers <= 4:
        ap.error("--layers must be 2, 3 or 4 (both layer kinds, within 16 GB)")
    return args


def memory_line(need: int) -> None:
    """Stop with one line unless ``need`` bytes are available now."""
    from remote.probe.facts import meminfo

    avail = meminfo()["available"]
    if avail and avail < need:
        raise SystemExit(
            f"realscale needs about {need / 2**30:.0f} GiB free, {avail / 2**30:.1f} GiB is "
            "available: free memory (other processes) and run it again"
        )


def warm(folder: str) -> None:
    """Read every file of ``folder`` once, so each load below finds the page cache warm."""
    for path in sorted(Path(folder).iterdir()):
        with open(path, "rb") as fh:
            while fh.read(64 << 20):
                pass


def run(name: str, cfg: dict) -> tuple[dict, int]:
    """A child's result and its peak RSS."""
    got = run_child(["-c", CHILD, name, json.dumps(cfg)])
    line = next(x for x in got.stdout.splitlines() if x.startswith("RESULT "))
    print(f"  {name} done ({load_avg()} load)", flush=True)
    return json.loads(line.removeprefix("RESULT ")), got.peak


def product(target: str, drafter: str, data, args, work: str) -> tuple[dict, int, int]:
    """``python -m remote eval`` of ``data``: (its result, its peak RSS, the peak RSS of
    its fixed runtime: python, torch, transformers and the modeling code)."""
    gt, spec = os.path.join(work, "gt.jsonl"), os.path.join(work, "job.json")
    with open(gt, "w") as fh:
        for i, (p, c) in enumerate(data):
            fh.write(json.dumps({"id": i, "prompt_ids": p, "completion_ids": c}) + "\n")
    job = {"target": target, "drafter": drafter, "ground_truth": gt, "threads": args.threads}
    job |= {"output_dir": os.path.join(work, "out"), "budgets": budgets(args)}
    Path(spec).write_text(json.dumps(job))
    runtime = run_child(
        [
            "-c",
            f"import remote.eval.engine, remote.eval.walk; from remote.eval.target import "
            f"describe; describe({target!r})",
        ]
    ).peak
    got = run_child(["-m", "remote", "eval", "--spec", spec])
    print(f"  remote eval done ({load_avg()} load)", flush=True)
    return json.loads(Path(work, "out", "result.json").read_text()), got.peak, runtime


def budgets(args) -> list[int]:
    return [int(b) for b in args.budgets.split(",") if b]


def weight_bytes(target: str, drafter: str) -> int:
    """The target's text weights and the drafter's, in bf16."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import describe, text_weight_bytes

    _c, meta, info = describe(target)
    _d, report = load_drafter(drafter, torch.bfloat16)
    return text_weight_bytes(meta, info, torch.bfloat16) + 2 * report.parameters


def work_per_layer(shapes: dict) -> dict[str, int]:
    """Multiply-adds per token of each layer kind's matrices."""
    return {k: sum(o * i for o, i in mats) for k, mats in shapes.items()}


def layer_times(engine: dict, kinds: list[str], clock: str) -> dict[str, float]:
    """Per layer kind, the mean over its layers of their time summed over the samples;
    ``other``: the rest of the forward (embedding, final norm, head and its argmax)."""
    per: dict[int, float] = {}
    for layers in engine["forward"]["layers"].values():
        for i, t in layers.items():
            per[int(i)] = per.get(int(i), 0.0) + t[clock]
    total = sum(t[clock] for t in engine["forward"]["total"].values())
    out = {}
    for kind in dict.fromkeys(kinds):
        mine = [per[i] for i, k in enumerate(kinds) if k == kind]
        out[kind] = sum(mine) / len(mine)
    out["other"] = total - sum(per.values())
    out["total"] = total
    return out


def compose(parts: dict[str, float]) -> float:
    """A 64-layer figure from per-kind parts (``other`` once)."""
    return parts["other"] + sum(n * parts[k] for k, n in REAL_LAYERS.items())


def report(args, kinds, shapes, gemm, hf, engine, result) -> dict:
    """Print every measured and composed ratio; the figures of the last line."""
    lin, full = "linear_attention", "full_attention"
    wall, cpu = layer_times(engine, kinds, "wall"), layer_times(engine, kinds, "cpu")
    work = work_per_layer(shapes)
    bound = {k: gemm[k]["wall"] for k in (lin, full)} | {"other": gemm["head"]["wall"]}
    bound_cpu = {k: gemm[k]["cpu"] for k in (lin, full)} | {"other": gemm["head"]["cpu"]}
    products = gemm.get("policy", "native")  # a run kept before the policy was recorded
    print(
        f"per layer, summed over the samples (wall s, best of the repeats; CPU s; bf16 "
        f"products {products}, the bound's as the engine's):"
    )
    for k in (lin, full):
        print(
            f"  {k:<17} {wall[k]:7.3f} ({cpu[k]:7.3f} CPU)  GEMM bound {bound[k]:7.3f}  "
            f"-> {wall[k] / bound[k]:.2f}x; matrix work {work[k] / 1e6:.0f}M multiply-adds/token"
        )
    print(
        f"  the rest (embedding, final norm, head + argmax) {wall['other']:.3f}, its GEMM "
        f"bound (head) {bound['other']:.3f}"
    )
    per_work = (wall[lin] / wall[full]) / (work[lin] / work[full])
    goal(
        "linear-attention layer / full-attention layer per unit of matrix work",
        per_work,
        "<=",
        1.1,
        f"CPU {(cpu[lin] / cpu[full]) / (work[lin] / work[full]):.2f}; "
        f"kernels {engine['linear_attention']}",
    )
    target64, bound64 = compose(wall), compose(bound)
    bound4 = bound["other"] + sum(bound[k] for k in kinds)
    goal(
        "target part / GEMM bound, composed to 64 layers",
        target64 / bound64,
        "<=",
        1.15,
        f"{args.layers} layers {wall['total'] / bound4:.2f}; composed {target64:.1f} s vs "
        f"{bound64:.1f} s; in CPU seconds {compose(cpu) / compose(bound_cpu):.2f}",
    )
    bare = sum(f["wall"] for f in hf["forward"])
    print(
        f"bare transformers forward (output_hidden_states, full logits) / engine forward = "
        f"{bare / wall['total']:.2f}   ({bare:.1f} s vs {wall['total']:.1f} s)"
    )
    # the first forward pages the weights in (both map the files): load + first forward,
    # not a difference of two forwards, which the load swings on a shared box
    ours, theirs = (
        {c: x["load"][c] + x["first"][c] for c in ("wall", "cpu")} for x in (engine, hf)
    )
    goal(
        "engine load + first forward / transformers' load + first forward",
        ours["wall"] / theirs["wall"],
        "<=",
        1.2,
        f"CPU {ours['cpu'] / theirs['cpu']:.2f}; {engine['load']['wall']:.1f} + "
        f"{engine['first']['wall']:.1f} s vs {hf['load']['wall']:.1f} + "
        f"{hf['first']['wall']:.1f} s",
    )
    d1, d2 = engine["drafter-1"], engine["drafter-2"]
    layer = d2["drafter"] - d1["drafter"]
    d5 = d2["drafter"] + (REAL_DRAFTER_LAYERS - 2) * layer
    print(
        f"drafter part at tau 1 ({d2['blocks']} blocks): 1 layer {d1['drafter']:.1f} s, 2 "
        f"layers {d2['drafter']:.1f} s (a layer before the last {layer:.1f} s), 5 layers "
        f"composed {d5:.1f} s = {d5 / target64:.2f} of the 64-layer target; DDTree "
        f"{d2['ddtree']:.1f} s"
    )
    t = result["timings"]
    costs = t["round_costs_s"]
    share = costs / (t["eval_s"] + costs)
    print(
        f"remote eval ({args.layers} layers, 2-layer drafter): load {t['load_target_s']:.1f} "
        f"s, walk {t['eval_s']:.1f} s (target {t['target_forward_s']:.1f}, drafter "
        f"{t['drafter_s']:.1f}, DDTree {t['ddtree_s']:.1f}), round costs {costs:.1f} s"
    )
    from remote.eval.round_timing import budget

    # the costs are target forwards, but the product stops them at a share of its walk
    # (`round_timing.budget`): composed, they grow with the target until that holds them
    walk64 = target64 + d5 + d2["ddtree"]
    costs64 = min(costs * target64 / wall["total"], costs / budget(t["eval_s"]) * budget(walk64))
    eval64 = target64 + d5 + d2["ddtree"] + costs64
    goal(
        "round costs / (walk + round costs), composed",
        costs64 / eval64,
        "<=",
        0.05,
        f"{args.layers} layers {share:.3f}",
        digits=3,
    )
    goal(
        "whole eval / GEMM bound at tau 1, composed",
        eval64 / bound64,
        "<=",
        2.0,
        f"{eval64:.0f} s: target {target64:.0f}, drafter {d5:.0f}, DDTree "
        f"{d2['ddtree']:.0f}, round costs {costs64:.0f}",
    )
    tokens = sum(len(p) + len(c) for p, c in samples(args.samples, args.prompt, args.completion))
    completion = args.samples * args.completion
    print(
        f"27B composed, this box, {args.threads} threads: target {1e3 * target64 / tokens:.0f} "
        f"ms/token ({args.threads * 1e3 * target64 / tokens:.0f} core-ms); eval at tau 1 "
        f"{args.threads * eval64 / completion:.2f} core-s per completion token; 128 prompts x "
        f"({args.prompt} + 512): {eval64 * 128 * (args.prompt + 512) / tokens / 3600:.1f} h"
    )
    return {
        "target/bound": target64 / bound64,
        "linear/full": per_work,
        "load/transformers": ours["wall"] / theirs["wall"],
        "round costs": costs64 / eval64,
        "eval/bound tau 1": eval64 / bound64,
        "parts": (target64, d5, d2["ddtree"], costs64, bound64, d2["blocks"] / completion),
    }


def trained(args, figures: dict) -> dict:
    """The whole eval / GEMM bound at the trained tiny pair's tau: the drafter and DDTree
    parts scaled by its blocks per completion token over the random drafter's."""
    from common import pair

    n = str(args.pair_samples)
    ns = pair.parser("").parse_args(
        ["--workdir", args.pair_workdir, "--budgets", args.budgets, "--samples", n]
        + ["--train-samples", n, "--threads", str(args.threads)]
    )
    if not pair.trained(ns):
        print(
            f"trained tau: no trained pair under {args.pair_workdir} (run "
            f"benchmarks/eval_drafter_share.py --samples {n} --train-samples {n} once to "
            "train it); figure left out"
        )
        return {}
    m = pair.loaded(ns)
    recs = pair.engine(m.target, m.drafter, m.samples, "walk", budgets(args))
    per_token = sum(r["blocks_drafted"] for r in recs) / sum(len(c) for _p, c in m.samples)
    target64, d5, dd, costs64, bound64, random_per_token = figures["parts"]
    f = per_token / random_per_token
    eval64 = target64 + f * (d5 + dd) + costs64
    tau = pair.tau(recs)
    goal(
        f"whole eval / GEMM bound at the trained tau {tau:.2f}, composed",
        eval64 / bound64,
        "<=",
        1.5,
        f"blocks per completion token {per_token:.3f} vs {random_per_token:.3f} "
        f"at tau 1; drafter {f * d5:.0f} s = {f * d5 / target64:.2f} of the target",
    )
    return {"tau": tau, "eval/bound tau": eval64 / bound64}


def last_line(f: dict) -> str:
    """The line a reader greps for: every done-when figure."""
    out = (
        f"realscale: target/bound {f['target/bound']:.2f}; linear/full {f['linear/full']:.2f}; "
        f"load/transformers {f['load/transformers']:.2f}; round costs "
        f"{100 * f['round costs']:.1f}%; peak RSS/weights {f['rss']:.3f}; eval/bound tau 1 "
        f"{f['eval/bound tau 1']:.2f}"
    )
    if "tau" in f:
        out += f", tau {f['tau']:.2f} {f['eval/bound tau']:.2f}"
    return out + f"; load {load_avg()}"


def measure(args, kinds) -> dict:
    """Every child's figures and peak RSS (``rss``: build, GEMM, transformers, engine,
    remote eval, remote eval's runtime), kept in ``--workdir``/last-run.json."""
    memory_line(12 * 2**30)
    built = run_child(
        [
            "-c",
            "import sys; sys.path.insert(0, 'benchmarks'); from common.realwidth import "
            f"build; build({args.workdir!r}, {args.layers})",
        ]
    )
    target, drafters = build(args.workdir, args.layers)  # cached now: paths only
    print(
        f"setup: target {args.layers} layers {kinds} of Qwen3.6-27B's text config, bf16; "
        f"drafters of 1 and 2 layers of hidden 5120; {args.samples} samples x "
        f"({args.prompt} + {args.completion}) tokens; threads {args.threads}; DDTree "
        f"budgets {args.budgets or 'none'}"
    )
    data = samples(args.samples, args.prompt, args.completion)
    shapes = linear_shapes(target)
    base = {"threads": args.threads, "repeats": args.repeats, "samples": data, "target": target}
    before = load_avg()
    warm(target)
    gemm, gemm_rss = run("gemm", base | {"shapes": shapes})
    hf, hf_rss = run("transformers", base)
    engine, engine_rss = run("engine", base | {"drafters": drafters, "budgets": budgets(args)})
    with tempfile.TemporaryDirectory(prefix="dflash-realscale-") as work:
        result, eval_rss, runtime = product(target, drafters[2], data, args, work)
    print(loads(before))
    raw = {"gemm": gemm, "transformers": hf, "engine": engine, "result": result}
    raw |= {"rss": [built.peak, gemm_rss, hf_rss, engine_rss, eval_rss, runtime]}
    Path(args.workdir, "last-run.json").write_text(json.dumps(raw))
    return raw


def main() -> None:
    args = parse()
    print(f"realscale: load average (1, 5, 15 min) {load_avg()} at the start")
    kinds = text_config(args.layers)["layer_types"]
    if args.from_run:  # the figures of a run before, reported again
        raw = json.loads(Path(args.from_run).read_text())
    else:
        raw = measure(args, kinds)
    target, drafters = build(args.workdir, args.layers)
    gemm, hf, engine, result = (raw[k] for k in ("gemm", "transformers", "engine", "result"))
    built, gemm_rss, hf_rss, engine_rss, eval_rss, runtime = raw["rss"]
    figures = report(args, kinds, linear_shapes(target), gemm, hf, engine, result)
    weights = weight_bytes(target, drafters[2])
    peak = max(raw["rss"][:5])
    print(
        f"peak RSS: build {built / 2**30:.1f} GiB, GEMM {gemm_rss / 2**30:.1f}, "
        f"transformers {hf_rss / 2**30:.1f}, engine {engine_rss / 2**30:.1f}, remote eval "
        f"{eval_rss / 2**30:.1f}: the benchmark's peak {peak / 2**30:.1f} GiB (goal < 14)"
    )
    figures["rss"] = eval_rss / weights
    goal(
        "remote eval peak RSS / weights",
        figures["rss"],
        "<=",
        1.05,
        f"(peak - runtime) / weights {(eval_rss - runtime) / weights:.3f}; weights "
        f"{weights / 2**30:.2f} GiB, runtime {runtime / 2**30:.2f} GiB",
        digits=3,
    )
    figures |= trained(args, figures)
    print(last_line(figures))


if __name__ == "__main__":
    main()
