"""The eval's drafter part at a 27B's proportions: round starts vs every completion position.

Setup, a Qwen3.6-27B's shape ratios scaled down: a random-weight Qwen3 target of 20 layers,
hidden 256, MLP 3.4x hidden (17408 / 5120), grouped-query attention, its LM head ~5% of
its weights (vocab 4096; the 27B's is 4.7%), 39 MB in bf16 (``--hidden`` scales every
width and the vocabulary with it, the ratios kept); and a 5-layer block-16 DFlash
drafter (layers of the target's shape, features of 5 target layers) of about 1/4-1/5 of its
weights, trained for real with `orchestrator.demo.train.train_drafter` on the target's own
greedy completions of random prompts until its token-weighted tau on the evaluation samples
(``--samples`` of the training samples: a random target's completions are loops of its own,
which a drafter learns sample by sample) reaches ``--tau`` (3). Target, samples and the
trained drafter are cached under ``--workdir`` (default
``~/.cache/dflash/bench-drafter-share``), so a rerun measures without retraining.

Measured in ONE run, rounds interleaved (median of ``--repeats``), on the same samples,
with the DDTree budgets (``--budgets``) and again without (the chain walk only):

* ``all``: the engine drafting a block at every completion position, one sample at a time
  (``positions="all"``, the engine before round-starts-only drafting; opt-in now);
* ``walk``: the default, blocks only where the chain walk and each DDTree budget's walk
  start rounds, all walks of the samples in lockstep (`remote.eval.walk.Lockstep`,
  `remote.eval.walk.eval_stream`);
* ``before``: the engine as #29 found it (``--before``, default b4dc523, the parent of the
  first commit drafting only where rounds start), in a child process importing that
  commit's ``remote/`` (`engine_before.py`): a block at every completion position, one
  sample at a time; its chain rounds must be today's;
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

import argparse
import functools
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import head_share, load_avg  # noqa: E402 (benchmarks/ is on the path)

from remote.eval.metrics import round_starts  # noqa: E402 (after the path fix above)
from remote.protocol import DEFAULT_BUDGETS  # noqa: E402


# A 27B's shape ratios (Qwen3.6-27B: MLP 3.4x hidden, grouped-query attention, head ~5% of
# the weights, a 5-layer drafter of the target's layer shape) at ``--hidden`` (256 by
# default: small enough to train the drafter on two cores in minutes).
def shapes(hidden: int) -> tuple[dict, dict]:
    """(target, drafter) settings at ``hidden``: heads of 64, one kv head per 4, the MLP
    3.375x hidden and the vocabulary 16x hidden, so every ratio stays as at 256."""
    mlp = hidden * 27 // 8
    target = dict(
        hidden_size=hidden,
        num_layers=20,
        num_heads=hidden // 64,
        num_kv_heads=hidden // 256,
        intermediate_size=mlp,
        model_vocab_size=16 * hidden,
    )
    return target, dict(num_layers=5, block_size=16, head_dim=64, intermediate_size=mlp)


LAYER_IDS = [1, 5, 9, 13, 17]  # spread over the target, the last layers left out


def greedy_rows(target_dir: str, n: int, prompt: int, completion: int, seed: int) -> list[dict]:
    """``n`` samples of random-token prompts and the target's greedy completions (float32,
    transformers' own generate with its KV cache, the prompts batched: they are all
    ``prompt`` tokens long, so nothing is padded)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    rng = random.Random(seed)
    prompts = [[rng.randrange(8, vocab) for _ in range(prompt)] for _ in range(n)]
    x = torch.tensor(prompts)
    with torch.inference_mode():
        out = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=completion,
            min_new_tokens=completion,
        )
    return [
        {"id": f"{seed}-{i}", "prompt_ids": p, "completion_ids": out[i, prompt:].tolist()}
        for i, p in enumerate(prompts)
    ]


def cached_rows(path: str, make) -> list[dict]:
    if os.path.isfile(path):
        return [json.loads(line) for line in open(path)]
    rows = make()
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)
    return rows


def walk_tau(target_dir: str, drafter_dir: str, rows: list[dict]) -> float:
    """Token-weighted tau of the drafter at ``drafter_dir`` on ``rows`` (bf16, the default
    eval, its products computed as the eval does here)."""
    import torch

    from remote.eval.device import computing
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_batch

    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    with computing(torch.device("cpu")):
        rounds = [r["rounds"] for r in eval_batch(target, drafter, samples, WalkOptions())]
    return sum(map(sum, rounds)) / sum(map(len, rounds))


def setup(args) -> tuple[str, str, list[dict], dict]:
    """(target dir, trained drafter dir, evaluation samples, training facts), cached.

    The drafter trains on ``--train-samples`` greedy completions, the first ``--samples``
    of which are the evaluation samples, with a checkpoint every 50 steps, and stops at
    the first whose token-weighted tau on them reaches ``--tau`` (or at ``--train-steps`` or
    after ``--train-minutes``: that checkpoint is measured, but not cached as the choice).
    ``--drafter``: that checkpoint (of a training here) instead of the chosen one.
    """
    import torch

    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.train import train_drafter

    # every cached thing is named for the shapes it depends on, so a changed shape rebuilds
    target_shape, drafter_shape = shapes(args.hidden)
    shape = "t{num_layers}x{hidden_size}v{model_vocab_size}".format(**target_shape)
    work = os.path.join(args.workdir, shape)
    os.makedirs(work, exist_ok=True)
    target = os.path.join(work, "target")
    if not os.path.isfile(os.path.join(target, "model.safetensors")):
        build_qwen3_target(target, dtype="bfloat16", **target_shape)
    length = f"p{args.prompt}c{args.completion}"
    train = cached_rows(
        os.path.join(work, f"train-{length}-n{args.train_samples}.jsonl"),
        lambda: greedy_rows(target, args.train_samples, args.prompt, args.completion, seed=1),
    )
    evals = train[: args.samples]
    d = "d{num_layers}b{block_size}".format(**drafter_shape)
    name = f"drafter-{d}-{length}-n{args.train_samples}-lr{args.lr}-tau{args.tau}"
    folder = os.path.join(work, name)
    chosen = os.path.join(folder, "chosen.json")
    if args.drafter:  # e.g. a checkpoint of a training stopped before its goal
        return target, args.drafter, evals, {"drafter": args.drafter, "train_s": None}
    if not os.path.isfile(chosen):
        t = time.perf_counter()
        torch.set_num_threads(args.threads)
        taus: dict[str, float] = {}

        def reached(path: str) -> bool:
            taus[path] = walk_tau(target, path, evals)
            print(f"  {os.path.basename(path)}: tau {taus[path]:.2f}", flush=True)
            late = time.perf_counter() - t > 60 * args.train_minutes
            return taus[path] >= args.tau or late

        shutil.rmtree(folder, ignore_errors=True)
        print(f"training the drafter (until tau {args.tau} on the evaluation samples) ...")
        paths = train_drafter(
            target,
            folder,
            save_steps=tuple(range(50, args.train_steps + 1, 50)),
            target_layer_ids=LAYER_IDS,
            rows=train,
            blocks_per_sample=16,
            batch_samples=2,
            lr=args.lr,
            until=reached,
            **drafter_shape,
        )
        facts = {"drafter": paths[-1], "tau": taus[paths[-1]], "train_s": time.perf_counter() - t}
        if facts["tau"] < args.tau:  # stopped by --train-minutes: used once, never cached
            print(f"training stopped before tau {args.tau}; measuring {paths[-1]}")
            return target, paths[-1], evals, facts
        with open(chosen + ".tmp", "w") as fh:
            json.dump(facts, fh)
        os.replace(chosen + ".tmp", chosen)
    facts = json.load(open(chosen))
    return target, facts["drafter"], evals, facts


def loaded(args) -> types.SimpleNamespace:
    """The set-up (`setup`) loaded for measuring, in bfloat16 with ``--threads``: its
    ``target_dir``, ``drafter_dir`` and training ``facts``; the engine's ``target`` and
    ``drafter`` (with its load ``report``); ``hf``, the target as a transformers model
    (the bare forward); ``samples``, (prompt ids, completion ids) each."""
    import torch
    from transformers import AutoModelForCausalLM

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    target_dir, drafter_dir, rows, facts = setup(args)
    torch.set_num_threads(args.threads)
    drafter, report = load_drafter(drafter_dir, torch.bfloat16)
    return types.SimpleNamespace(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        facts=facts,
        target=load_target(target_dir, torch.bfloat16),
        drafter=drafter,
        report=report,
        hf=AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval(),
        samples=[(r["prompt_ids"], r["completion_ids"]) for r in rows],
    )


def engine(target, drafter, samples, positions: str, budgets: list[int]) -> list[dict]:
    """What `remote.eval.engine.run_eval` runs for ``samples`` (prompt, completion): their
    records, the samples walking in its pool (`remote.eval.walk.eval_stream`)."""
    from remote.eval.walk import WalkOptions, eval_batch

    return eval_batch(target, drafter, samples, WalkOptions(budgets=budgets, positions=positions))


# The engine as #29 found it: the parent of e21d99a, the first commit drafting blocks only
# where rounds start (it drafts a block at every completion position, one sample at a time).
BEFORE = "b4dc5237137d183244e61f9f6c09452118f50708"


def before_tree(rev: str, into: str) -> str | None:
    """``rev``'s ``remote/`` extracted under ``into`` (`engine_before.py` imports it), or
    None, said in one line, where this is no git checkout holding ``rev``."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tree = os.path.join(into, "before")
    os.makedirs(tree)
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "--format=tar", rev, "remote"],
        capture_output=True,
    )
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip().splitlines()[-1:]
        print(f"before: no engine of {rev} to measure ({' '.join(why) or 'git failed'})")
        return None
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def run_before(tree: str, dirs, samples_file: str, threads: int, clock: str, budgets: tuple):
    """One timed pass of the engine in ``tree`` over the samples, in a child process
    (`engine_before.py`): its records and the pass's wall and CPU seconds."""
    from remote.eval import cpu_bf16

    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "engine_before.py"), tree, *dirs, samples_file]
    cmd += ["--budgets", ",".join(map(str, budgets)), "--threads", str(threads)]
    cmd += ["--bf16-products", cpu_bf16.policy()]  # its products computed as today's are
    out = subprocess.run([*cmd, "--clock", clock], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"before: the earlier engine failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def timed_modes(target, drafter, hf, samples, budget_sets, repeats: int, before=None) -> dict:
    """Per mode (``all`` or ``walk``, with each of ``budget_sets``; and ``before``, the
    earlier engine, where ``before`` (`run_before` but for the budgets) is given), the
    median over interleaved rounds of its wall and CPU time and parts; the records of the
    last round. Every mode computes its bfloat16 products as the eval does on this CPU
    (`remote.eval.device.computing`)."""
    import torch

    from remote.eval.device import computing

    def bare() -> None:
        for p, c in samples:
            hf(input_ids=torch.tensor([p + c]))

    names = ("all", "walk") if before is None else ("before", "all", "walk")
    modes = ["bare"] + [(m, tuple(b)) for b in budget_sets for m in names]
    times: dict = {m: {} for m in modes}
    recs: dict = {}
    with torch.inference_mode(), computing(torch.device("cpu")):
        bare()  # warm-up of both
        engine(target, drafter, samples, "walk", list(budget_sets[0]))
        for r in range(repeats):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                t, cpu = time.perf_counter(), time.process_time()
                got = None
                if mode == "bare":
                    bare()
                elif mode[0] == "before":
                    got = before(mode[1])
                    recs[mode] = got["records"]
                else:
                    recs[mode] = engine(target, drafter, samples, mode[0], list(mode[1]))
                spent = {"wall": time.perf_counter() - t, "cpu": time.process_time() - cpu}
                if got is not None:  # its child's timed pass, not its start and loads
                    spent = {k: got[k] for k in spent}
                for k, v in spent.items():
                    times[mode].setdefault(k, []).append(v)
                for part in ("target", "drafter", "ddtree"):
                    if mode != "bare":
                        part_s = sum(rec["seconds"][part] for rec in recs[mode])
                        times[mode].setdefault(part, []).append(part_s)
    med = {m: {k: statistics.median(v) for k, v in parts.items()} for m, parts in times.items()}
    return {"median": med, "records": recs}


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


def hidden_size(text: str) -> int:
    """``--hidden``: a positive multiple of 256, so the heads (of 64) split evenly into kv
    groups of 4 as at 256."""
    if not text.isdigit() or int(text) == 0 or int(text) % 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive multiple of 256 (e.g. 512)")
    return int(text)


def parse_args() -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument(  # this script's own: the set-up's takers measure no earlier engine
        "--before",
        default=BEFORE,
        help="also measure this commit's engine (default: the engine as #29 found it); "
        "'none': do not",
    )
    return ap.parse_args()


def parser(doc: str) -> argparse.ArgumentParser:
    """The set-up's and the measurement's options (`setup`), for this script and those that
    take its set-up; ``doc``: the script's description."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default=os.path.expanduser("~/.cache/dflash/bench-drafter-share"))
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument(
        "--hidden", type=hidden_size, default=256, help="target and drafter hidden size"
    )
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=320)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)))
    ap.add_argument("--train-samples", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=1500, help="at most")
    ap.add_argument("--tau", type=float, default=3.0, help="train until this tau, at least")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument(
        "--train-minutes", type=float, default=60, help="stop training after this, at most"
    )
    ap.add_argument("--drafter", help="measure this checkpoint of a training here instead")
    ap.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="the parts' clock: process CPU time (default; wall time on a shared machine "
        "moves with the other processes' load) or wall time",
    )
    return ap


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
    who = "#29's engine" if rev == BEFORE else f"{rev}'s engine"
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
    args = parse_args()
    import torch

    from remote.eval.device import computing

    budgets = [int(b) for b in args.budgets.split(",") if b]
    m = loaded(args)
    target_dir, drafter_dir, facts = m.target_dir, m.drafter_dir, m.facts
    target, drafter, report, hf, samples = m.target, m.drafter, m.report, m.hf, m.samples
    print_setup(args, target_dir, drafter, report, samples, budgets, facts)

    budget_sets = [tuple(budgets), ()] if budgets else [()]
    if args.clock == "cpu":
        from remote.eval import drafts

        drafts.CLOCK = time.process_time
    dirs = (target_dir, drafter_dir)
    with tempfile.TemporaryDirectory(prefix="bench-before-") as tmp:
        tree = None if args.before == "none" else before_tree(args.before, tmp)
        before = None
        if tree is not None:
            path = os.path.join(tmp, "samples.json")
            with open(path, "w") as fh:
                json.dump(samples, fh)
            before = functools.partial(run_before, tree, dirs, path, args.threads, args.clock)
        load = load_avg()
        got = timed_modes(target, drafter, hf, samples, budget_sets, args.repeats, before)
    print(
        f"load average (1, 5, 15 min): {load} before, {load_avg()} after; median of "
        f"{args.repeats} interleaved rounds"
    )
    med, recs = got["median"], got["records"]
    for b in budget_sets:
        with computing(torch.device("cpu")):  # as the rounds were walked
            check_rounds(dirs, target, drafter, samples, b, recs[("all", b)], recs[("walk", b)])
        if before is not None:
            check_before(recs[("before", b)], recs[("walk", b)], b)
    for b in budget_sets:
        print_parts(med, recs, b, args.clock, None if before is None else args.before)


if __name__ == "__main__":
    main()
