"""The trained 27B-shaped pair the drafter benchmarks share (`eval_drafter_share.py`,
`feature_cache.py`, `cpu_bf16.py`).

A random-weight Qwen3 target at Qwen3.6-27B's shape ratios, scaled down: 20 layers, hidden
256, MLP 3.375x hidden (17408 / 5120), grouped-query attention (heads of 64, one kv head per
4), its LM head ~5% of its weights (vocabulary 16x hidden; the 27B's head is 4.7%).
``--hidden`` scales every width and the vocabulary, the ratios kept. A 5-layer block-16
DFlash drafter of the target's layer shape (features of 5 target layers, about 1/4-1/5 of
its weights) is trained for real (`orchestrator.demo.train.train_drafter`) on the target's
own greedy completions of random prompts until its token-weighted tau on the evaluation
samples (the first ``--samples`` of the training samples: a random target's completions
are loops of its own, which a drafter learns sample by sample) reaches ``--tau``. Target,
samples and drafter are cached under ``--workdir``, each named for the shapes it depends
on, so a rerun only measures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
import types

LAYER_IDS = [1, 5, 9, 13, 17]  # spread over the target, the last layers left out


def shapes(hidden: int) -> tuple[dict, dict]:
    """(target, drafter) settings at ``hidden``, every ratio as at 256."""
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


def hidden_size(text: str) -> int:
    """``--hidden``: a positive multiple of 256, so the heads (of 64) split evenly into kv
    groups of 4 as at 256."""
    if not text.isdigit() or int(text) == 0 or int(text) % 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive multiple of 256 (e.g. 512)")
    return int(text)


def parser(doc: str) -> argparse.ArgumentParser:
    """The pair's options and the measurement's (``--threads``, ``--repeats``,
    ``--budgets``, ``--clock``); ``doc``: the script's description."""
    from remote.protocol import DEFAULT_BUDGETS

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
    ap.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
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


def budget_list(args) -> list[int]:
    """``--budgets`` as numbers (none: the chain walk only)."""
    return [int(b) for b in args.budgets.split(",") if b]


def greedy_rows(target_dir: str, n: int, prompt: int, completion: int, seed: int) -> list[dict]:
    """``n`` samples of random-token prompts and the target's greedy completions (float32,
    transformers' own generate; the prompts are all ``prompt`` long: nothing is padded)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    rng = random.Random(seed)
    prompts = [[rng.randrange(8, hf.config.vocab_size) for _ in range(prompt)] for _ in range(n)]
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
    with open(path + ".tmp", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    return rows


def walk_tau(target_dir: str, drafter_dir: str, rows: list[dict]) -> float:
    """Token-weighted tau of the drafter on ``rows`` (bf16, the default eval)."""
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


def folders(args) -> tuple[str, str]:
    """(the target's work folder, the trained drafter's) that `setup` uses for ``args``."""
    target_shape, drafter_shape = shapes(args.hidden)
    work = os.path.join(
        args.workdir, "t{num_layers}x{hidden_size}v{model_vocab_size}".format(**target_shape)
    )
    d = "d{num_layers}b{block_size}".format(**drafter_shape)
    length = f"p{args.prompt}c{args.completion}"
    every = "" if args.save_every == 50 else f"-e{args.save_every}"
    name = f"drafter-{d}-{length}-n{args.train_samples}-lr{args.lr}-tau{args.tau}{every}"
    return work, os.path.join(work, name)


def trained(args) -> bool:
    """Whether `setup` has the drafter for ``args`` trained and chosen already (no training)."""
    return os.path.isfile(os.path.join(folders(args)[1], "chosen.json"))


def setup(args) -> tuple[str, str, list[dict], dict]:
    """(target dir, trained drafter dir, evaluation samples, training facts), cached.

    The drafter trains on ``--train-samples`` greedy completions with a checkpoint every
    ``--save-every`` steps, and stops at the first whose tau on the evaluation samples
    reaches ``--tau``, or at ``--train-steps``, or after ``--train-minutes`` (that
    checkpoint is measured, but not cached as the choice: where the clock stopped it
    depends on the machine). ``--drafter``: that checkpoint instead of the chosen one.
    """
    from orchestrator.demo.models import build_qwen3_target

    work, folder = folders(args)
    target_shape, drafter_shape = shapes(args.hidden)
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
    if args.drafter:  # e.g. a checkpoint of a training stopped before its goal
        return target, args.drafter, evals, {"drafter": args.drafter, "train_s": None}
    chosen = os.path.join(folder, "chosen.json")
    if not os.path.isfile(chosen):
        facts = _train(args, target, folder, train, evals, drafter_shape)
        if facts.pop("late"):  # stopped by --train-minutes: used once, never cached
            print(f"training stopped after {args.train_minutes} min; measuring {facts['drafter']}")
            return target, facts["drafter"], evals, facts
        with open(chosen + ".tmp", "w") as fh:
            json.dump(facts, fh)
        os.replace(chosen + ".tmp", chosen)
    facts = json.load(open(chosen))
    return target, facts["drafter"], evals, facts


def _train(args, target: str, folder: str, train, evals, drafter_shape: dict) -> dict:
    """Train into ``folder`` until `setup`'s stop; the last checkpoint's facts."""
    import torch

    from orchestrator.demo.train import train_drafter

    t = time.perf_counter()
    torch.set_num_threads(args.threads)
    taus: dict[str, float] = {}
    late: list[bool] = []

    def reached(path: str) -> bool:
        taus[path] = walk_tau(target, path, evals)
        print(f"  {os.path.basename(path)}: tau {taus[path]:.2f}", flush=True)
        late.append(time.perf_counter() - t > 60 * args.train_minutes)
        return taus[path] >= args.tau or late[-1]

    shutil.rmtree(folder, ignore_errors=True)
    print(f"training the drafter (until tau {args.tau} on the evaluation samples) ...")
    paths = train_drafter(
        target,
        folder,
        save_steps=tuple(range(args.save_every, args.train_steps + 1, args.save_every)),
        target_layer_ids=LAYER_IDS,
        rows=train,
        blocks_per_sample=16,
        batch_samples=2,
        lr=args.lr,
        until=reached,
        **drafter_shape,
    )
    return {
        "drafter": paths[-1],
        "tau": taus[paths[-1]],
        "train_s": time.perf_counter() - t,
        "late": bool(late) and late[-1] and taus[paths[-1]] < args.tau,
    }


def loaded(args) -> types.SimpleNamespace:
    """The pair loaded for measuring, bf16, ``--threads``: ``target_dir``, ``drafter_dir``,
    training ``facts``; the engine's ``target`` and ``drafter`` (its load ``report``);
    ``hf``, the target as a transformers model (the bare forward); ``samples``, (prompt
    ids, completion ids) each."""
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
    """What `remote.eval.engine.run_eval` runs for ``samples``: their records, the samples
    walking in its pool (`remote.eval.walk.eval_stream`)."""
    from remote.eval.walk import WalkOptions, eval_batch

    return eval_batch(target, drafter, samples, WalkOptions(budgets=budgets, positions=positions))


def bare(hf, samples) -> None:
    """A bare transformers forward of the target over each sample (full logits)."""
    import torch

    for p, c in samples:
        hf(input_ids=torch.tensor([p + c]))


def tau(records: list[dict]) -> float:
    """Token-weighted tau of ``records``' chain rounds."""
    rounds = [r["rounds"] for r in records]
    return sum(map(sum, rounds)) / sum(map(len, rounds))
