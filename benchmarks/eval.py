"""Benchmark the offline eval engine on a target big enough that weight streaming matters.

Prints ratios measured in ONE run on this machine (no absolute targets, no assertions):

* eval wall time / bare target forward time over the same tokens   (goal <= 1.25), without
  DDTree and with the CLI's default DDTree budgets 8,16,32,64 (goal <= 2.0 on this
  head-heavy target), and the same two on a body-heavy target whose LM head is ~5% of the
  weights, as a 27B model's (``--body-*``: 14 layers, hidden 1024, vocab 8192; goal <= 1.25
  with DDTree)
* online speculative-decoding loop time / offline eval time        (goal >= 5)
* peak RSS of a fresh ``python -m remote eval`` / weights' bytes   (goal <= 1.3), on this
  target and on a bigger one (``--rss-hidden``/``--rss-layers``, ~2.4 GB), with the fixed
  runtime (python + torch + transformers + the target's modeling code) printed beside it;
  and on a MoE VLM target (``--moe-hidden``/``--moe-layers``/``--moe-experts``, a
  Qwen3.5-MoE with a vision tower, ~2 GB: per-expert checkpoint keys that the loader fuses
  as transformers does, vision weights never read)

Setup: a random-weight Qwen3 target (default hidden 1536, 12 layers, vocab 32000: ~440M
parameters, ~0.9 GB in bf16) and a random 1-layer z-lab drafter (block 16), saved under
``--workdir`` (reused when present). Ground truth = the online loop's own greedy output, so
both sides walk the same tokens. A random drafter accepts ~nothing (tau ~1): the online loop's
worst case. For the offline eval it is the cheapest case: acceptance needs the drafter's last
layer and head only at about tau rows per position, and DDTree's walks visit every position
but its tree search stops at depth 1 when the ground truth is not among the top-k there (a
better drafter costs more rows per visit and fewer visits; ``rows_sensitivity`` shows the
chain's side of that).

``--completion 128,256,512,1024`` (a list) prints only the growth rows: eval time per
completion token with the default DDTree budgets (and its target / drafter / DDTree parts) as
a ratio to the first length (goal <= 1.3 at 1024), and the peak RSS of ``python -m remote
eval`` at each length above the fixed runtime, over the weights (goal <= 1.15 at 1024).

    python benchmarks/eval.py [--samples 2] [--prompt 128] [--completion 128] [--threads 2]
    python benchmarks/eval.py --rss-only     # the peak-RSS rows alone (random ground truth)
    python benchmarks/eval.py --ddtree-only  # the DDTree rows alone, both targets
    python benchmarks/eval.py --completion 128,256,512,1024 --samples 1   # growth rows
    python benchmarks/eval.py --e2e          # end to end: `dflash remote-eval` (loopback host,
                                             # local ground truth) vs a plain generate script
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(workdir: str, hidden: int, layers: int, vocab: int) -> tuple[str, str]:
    import torch

    from orchestrator.demo.models import build_qwen3_target
    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab

    target = os.path.join(workdir, "target")
    drafter = os.path.join(workdir, "drafter")
    if not os.path.isfile(os.path.join(target, "model.safetensors")):
        build_qwen3_target(
            target,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=hidden // 128,
            num_kv_heads=max(1, hidden // 512),
            intermediate_size=int(hidden * 8 / 3) // 64 * 64,
            model_vocab_size=vocab,
            dtype="bfloat16",
        )
    if not os.path.isfile(os.path.join(drafter, "model.safetensors")):
        cfg = json.load(open(os.path.join(target, "config.json")))
        dcfg = {
            k: cfg[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "rms_norm_eps",
                "vocab_size",
                "rope_parameters",
                "max_position_embeddings",
            )
        }
        dcfg.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            num_hidden_layers=1,
            block_size=16,
            num_target_layers=layers,
            dflash_config={"target_layer_ids": [1, layers // 2, layers - 2], "mask_token_id": 3},
        )
        torch.manual_seed(0)
        save_zlab(DFlashDrafter(DrafterConfig.from_dict(dcfg)).to(torch.bfloat16), drafter)
    return target, drafter


def build_moe(workdir: str, hidden: int, layers: int, experts: int, vocab: int) -> tuple[str, str]:
    """A random Qwen3.5-MoE VLM target (bf16, saved as users save it: one key per expert)
    and a random 1-layer drafter over its layers 1, n/2, n-2."""
    import torch
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    from remote.eval.drafter import DFlashDrafter, DrafterConfig, save_zlab

    target = os.path.join(workdir, "target")
    drafter = os.path.join(workdir, "drafter")
    heads = hidden // 128
    if not os.path.isfile(os.path.join(target, "config.json")):
        text = dict(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 4),
            head_dim=128,
            vocab_size=vocab,
            num_experts=experts,
            num_experts_per_tok=8,
            moe_intermediate_size=hidden // 2,
            shared_expert_intermediate_size=hidden // 2,
            linear_num_key_heads=heads // 2,
            linear_num_value_heads=heads,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        )
        vision = dict(
            depth=2, hidden_size=256, intermediate_size=512, num_heads=4, out_hidden_size=hidden
        )
        cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision)
        torch.manual_seed(0)
        model = Qwen3_5MoeForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(target)
        del model
    if not os.path.isfile(os.path.join(drafter, "model.safetensors")):
        text = json.load(open(os.path.join(target, "config.json")))["text_config"]
        dcfg = {
            k: text[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "rms_norm_eps",
                "vocab_size",
                "max_position_embeddings",
            )
        }
        dcfg.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            num_hidden_layers=1,
            block_size=16,
            intermediate_size=hidden * 3,
            num_target_layers=layers,
            dflash_config={"target_layer_ids": [1, layers // 2, layers - 2], "mask_token_id": 3},
        )
        torch.manual_seed(0)
        save_zlab(DFlashDrafter(DrafterConfig.from_dict(dcfg)).to(torch.bfloat16), drafter)
    return target, drafter


HWM_WRAPPER = """
import atexit, runpy, sys
def hwm():
    # VmHWM is per address space: it starts afresh at exec, unlike ru_maxrss, which a forked
    # child inherits from its (large) parent
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            sys.stderr.write('VMHWM ' + line.split()[1] + chr(10))
atexit.register(hwm)
sys.argv = sys.argv[1:]
if sys.argv[0] == '-m':
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
else:
    exec(sys.argv[1])
"""


def peak_rss_of(args: list[str]) -> int:
    """Peak RSS bytes of a fresh Python child running ``-m module args...`` or ``-c code``."""
    proc = subprocess.run(
        [sys.executable, "-c", HWM_WRAPPER, *args],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if proc.returncode:
        raise SystemExit(f"child {args} failed: {proc.stderr[-2000:]}")
    kib = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("VMHWM ")]
    return kib[-1] * 1024


MODES = {  # label -> WalkOptions arguments
    "all": {},
    "all+DDTree": {"budgets": [8, 16, 32, 64]},
    "walk": {"positions": "walk"},
}


def rss_figures(
    workdir: str,
    target_dir: str,
    drafter_dir: str,
    prompts,
    seqs,
    threads: int,
    budgets: list[int] | None = None,
) -> tuple[int, int, int]:
    """(peak RSS of ``python -m remote eval``, fixed runtime RSS, weights' bytes) on one target,
    with DDTree ``budgets`` (none by default)."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import describe, text_weight_bytes

    gt = os.path.join(workdir, "gt.jsonl")
    with open(gt, "w") as fh:
        for i, (p, g) in enumerate(zip(prompts, seqs, strict=False)):
            fh.write(json.dumps({"id": i, "prompt_ids": p, "completion_ids": g[len(p) :]}) + "\n")
    spec = os.path.join(workdir, "job.json")
    json.dump(
        {
            "target": target_dir,
            "drafter": drafter_dir,
            "ground_truth": gt,
            "output_dir": os.path.join(workdir, "out"),
            "threads": threads,
            "budgets": budgets or [],
        },
        open(spec, "w"),
    )
    # The runtime an eval cannot do without: interpreter, torch, transformers and the
    # target's modeling code (whose import pulls in much of transformers and torch._dynamo).
    base = peak_rss_of(
        [
            "-c",
            "import remote.eval.engine, remote.eval.walk, remote.eval.drafter; "
            f"from remote.eval.target import describe; describe({target_dir!r})",
        ]
    )
    peak = peak_rss_of(["-m", "remote", "eval", "--spec", spec])
    _c, meta, info = describe(target_dir)
    _d, report = load_drafter(drafter_dir, torch.bfloat16)
    return peak, base, text_weight_bytes(meta, info, torch.bfloat16) + report.parameters * 2


DEFAULT_BUDGETS = [8, 16, 32, 64]  # the CLI's default DDTree budgets


def random_seqs(vocab: int, samples: int, prompt: int, completion: int, seed: int = 0):
    """(prompts, prompt + completion sequences) of random tokens: a random drafter accepts
    nothing on them, as on the target's own greedy output."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(prompt)] for _ in range(samples)]
    return prompts, [p + [rng.randrange(10, vocab) for _ in range(completion)] for p in prompts]


def head_share(target_dir: str) -> float:
    """The LM head's share of the target's text weights (embedding and head included)."""
    import torch

    from remote.eval.target import describe, text_weight_bytes

    _c, meta, info = describe(target_dir)
    head = meta.get_submodule(info.head_path).weight.numel() * 2
    return head / text_weight_bytes(meta, info, torch.bfloat16)


def ddtree_ratios(target_dir: str, drafter_dir: str, prompts, seqs, repeats: int) -> dict:
    """Seconds of a bare HF forward (full logits) and of the offline eval without and with
    the default DDTree budgets over the same sequences, interleaved, best of ``repeats``."""
    import torch
    from transformers import AutoModelForCausalLM

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    modes = {"all": WalkOptions(), "all+DDTree": WalkOptions(budgets=DEFAULT_BUDGETS)}
    best = {k: 0.0 for k in ("bare", *modes)}
    with torch.inference_mode():
        hf(input_ids=torch.tensor([seqs[0][:32]]))  # warm-up
        eval_sequence(target, drafter, prompts[0][:16], seqs[0][16:40], modes["all+DDTree"])
        for p, g in zip(prompts, seqs, strict=True):
            per = {k: float("inf") for k in best}
            for _ in range(repeats):
                t = time.perf_counter()
                hf(input_ids=torch.tensor([g]))
                per["bare"] = min(per["bare"], time.perf_counter() - t)
                for mode, opts in modes.items():
                    t = time.perf_counter()
                    eval_sequence(target, drafter, p, g[len(p) :], opts)
                    per[mode] = min(per[mode], time.perf_counter() - t)
            for k in best:
                best[k] += per[k]
    return best


def print_ddtree(label: str, target_dir: str, best: dict, goal: float) -> None:
    print(
        f"DDTree [{label}, head {100 * head_share(target_dir):.1f}% of the weights]: "
        f"bare forward {best['bare']:.2f} s; load avg {os.getloadavg()[0]:.2f}"
    )
    print(
        f"  eval [all       ] / bare = {best['all'] / best['bare']:.2f}\n"
        f"  eval [all+DDTree] / bare = {best['all+DDTree'] / best['bare']:.2f}"
        f"   (goal <= {goal}; budgets {','.join(map(str, DEFAULT_BUDGETS))})"
    )


def body_ddtree(args) -> None:
    """The DDTree rows on the body-heavy target (``--body-*``), random ground truth."""
    if not args.body_hidden:
        return
    work = os.path.join(
        args.workdir, f"body-{args.body_hidden}x{args.body_layers}v{args.body_vocab}"
    )
    os.makedirs(work, exist_ok=True)
    target_dir, drafter_dir = build(work, args.body_hidden, args.body_layers, args.body_vocab)
    prompts, seqs = random_seqs(args.body_vocab, args.samples, args.prompt, args.completion)
    best = ddtree_ratios(target_dir, drafter_dir, prompts, seqs, args.repeats)
    label = f"body-heavy {args.body_layers} x {args.body_hidden}, vocab {args.body_vocab}"
    print_ddtree(label, target_dir, best, 1.25)


def growth_rows(args, target_dir: str, drafter_dir: str, lengths: list[int]) -> None:
    """Eval time per completion token (default DDTree budgets included) at each completion
    length, as a ratio to the first length, with its target / drafter / DDTree parts; and
    the peak RSS of ``python -m remote eval`` above the fixed runtime, over the weights."""
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    target = load_target(target_dir, torch.bfloat16)
    drafter, _ = load_drafter(drafter_dir, torch.bfloat16)
    opts = WalkOptions(budgets=DEFAULT_BUDGETS)
    seqs = {n: random_seqs(args.vocab, args.samples, args.prompt, n, seed=n) for n in lengths}
    best: dict[int, dict[str, float]] = {n: {} for n in lengths}
    with torch.inference_mode():
        eval_sequence(target, drafter, [5] * 16, [6] * 24, opts)  # warm-up
        for _ in range(args.repeats):  # lengths interleaved within each round
            for n in lengths:
                part = {"total": 0.0, "target": 0.0, "drafter": 0.0, "ddtree": 0.0}
                for p, g in zip(*seqs[n], strict=True):
                    rec = eval_sequence(target, drafter, p, g[len(p) :], opts)
                    for k in part:
                        part[k] += rec["seconds"][k]
                for k, v in part.items():
                    best[n][k] = min(best[n].get(k, float("inf")), v)
    del target, drafter
    rss = {}
    for n in lengths:
        work = os.path.join(args.workdir, f"growth-{n}")
        os.makedirs(work, exist_ok=True)
        rss[n] = rss_figures(work, target_dir, drafter_dir, *seqs[n], args.threads, DEFAULT_BUDGETS)
    first = lengths[0]
    per_tok = {n: {k: v / (n * args.samples) for k, v in b.items()} for n, b in best.items()}
    print(
        f"growth: prompt {args.prompt}, {args.samples} sample(s) per length, budgets "
        f"{','.join(map(str, DEFAULT_BUDGETS))}, threads {args.threads}, best of "
        f"{args.repeats} interleaved rounds; load avg "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(
        "  completion  ms/token  ratio vs first (goal <= 1.3)  [target drafter ddtree]"
        "  (peak RSS - runtime) / weights (goal <= 1.15)"
    )
    for n in lengths:
        t, f = per_tok[n], per_tok[first]
        peak, base, weights = rss[n]
        parts = " ".join(
            f"{t[k] / f[k]:.2f}" if f[k] else "-" for k in ("target", "drafter", "ddtree")
        )
        print(
            f"  {n:10d}  {1000 * t['total']:8.2f}  {t['total'] / f['total']:28.2f}  [{parts}]"
            f"  {(peak - base) / weights:.2f} (peak {peak / 2**20:.0f} MiB, runtime "
            f"{base / 2**20:.0f} MiB, weights {weights / 2**20:.0f} MiB)"
        )


def rows_sensitivity(target, drafter, prompts, seqs, repeats: int) -> dict[int, float]:
    """Seconds of the engine's target forward + drafter work if every position needed ``m``
    rows of the last drafter layer and head, as a drafter accepting about ``m - 1`` tokens
    per position does (the random drafter here needs about 1): how the eval/bare ratio grows
    with a better drafter, without training one."""
    import torch

    out: dict[int, float] = {}
    with torch.inference_mode():
        for m in (1, 3, 6):
            total = 0.0
            for p, g in zip(prompts, seqs, strict=False):
                best = float("inf")
                for _ in range(repeats):
                    t = time.perf_counter()
                    feats, _ = target.forward(
                        g, drafter.cfg.target_layer_ids, argmax_from=len(p) - 1
                    )
                    kv = drafter.context_kv(feats)
                    st = torch.arange(len(p), len(g) - 1)
                    blocks = drafter.blocks(kv, st, torch.tensor(g)[st], target.embed)
                    for j in range(1, m + 1):
                        rows = torch.arange(len(st)) * drafter.block_size + j
                        torch.argmax(
                            drafter.logits(blocks.hidden(rows), target.lm_head).float(), -1
                        )
                    best = min(best, time.perf_counter() - t)
                total += best
            out[m] = total
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default="/tmp/dflash-bench")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument(
        "--completion",
        default="128",
        help="completion tokens; a list (128,256,512,1024) gives only the growth rows: time "
        "per completion token vs the first length, peak RSS over the weights",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument(
        "--rss-hidden", type=int, default=2048, help="the bigger target of the RSS figure (0: skip)"
    )
    ap.add_argument("--rss-layers", type=int, default=24)
    ap.add_argument(
        "--moe-hidden",
        type=int,
        default=1024,
        help="the MoE VLM target of the RSS figure (0: skip)",
    )
    ap.add_argument("--moe-layers", type=int, default=12)
    ap.add_argument("--moe-experts", type=int, default=48)
    ap.add_argument(
        "--body-hidden",
        type=int,
        default=1024,
        help="the body-heavy target of the DDTree rows (head ~5%% of the weights, as a 27B "
        "model's; 0: skip)",
    )
    ap.add_argument("--body-layers", type=int, default=14)
    ap.add_argument("--body-vocab", type=int, default=8192)
    ap.add_argument(
        "--ddtree-only",
        action="store_true",
        help="only the DDTree rows (this target and the body-heavy one), random ground truth",
    )
    ap.add_argument(
        "--rss-only",
        action="store_true",
        help="only the peak-RSS rows, on random ground truth (no speed figures)",
    )
    ap.add_argument(
        "--e2e",
        action="store_true",
        help="only the end-to-end row: dflash remote-eval vs a plain generate script",
    )
    ap.add_argument("--e2e-hidden", type=int, default=256)
    ap.add_argument("--e2e-layers", type=int, default=4)
    ap.add_argument("--e2e-new", type=int, default=32)
    ap.add_argument(
        "--e2e-other-tree",
        default=None,
        help="also time the same remote-eval from this source tree in every round (before "
        "vs after a change)",
    )
    ap.add_argument(
        "--e2e-gt-concurrency",
        type=int,
        default=None,
        help="prompts per local generate call (dflash's default 16; 1: one at a time, "
        "as the plain script)",
    )
    args = ap.parse_args()
    if args.e2e:
        e2e_row(args)
        return

    import random

    import torch

    torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    target_dir, drafter_dir = build(args.workdir, args.hidden, args.layers, args.vocab)
    lengths = [int(x) for x in str(args.completion).split(",")]
    if len(lengths) > 1:
        growth_rows(args, target_dir, drafter_dir, lengths)
        return
    args.completion = lengths[0]
    if args.rss_only:
        prompts, seqs = random_seqs(args.vocab, args.samples, args.prompt, args.completion)
        print_rss(rss_rows(args, target_dir, drafter_dir, prompts, seqs))
        return
    if args.ddtree_only:
        prompts, seqs = random_seqs(args.vocab, args.samples, args.prompt, args.completion)
        best = ddtree_ratios(target_dir, drafter_dir, prompts, seqs, args.repeats)
        print_ddtree(f"{args.layers} x {args.hidden}, vocab {args.vocab}", target_dir, best, 2.0)
        body_ddtree(args)
        return

    from transformers import AutoModelForCausalLM

    from orchestrator.demo.oracle import online_rounds
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    drafter, report = load_drafter(drafter_dir, torch.bfloat16)
    rng = random.Random(0)
    prompts = [
        [rng.randrange(10, args.vocab) for _ in range(args.prompt)] for _ in range(args.samples)
    ]

    with torch.inference_mode():
        online_rounds(hf, drafter, prompts[0][:16], 4)  # warm-up
        t = time.perf_counter()
        runs = [online_rounds(hf, drafter, p, args.completion) for p in prompts]
        t_online = time.perf_counter() - t  # one run: minutes long, less sensitive to bursts
        seqs = [p + c for p, (_r, c) in zip(prompts, runs, strict=False)]

    # Bare forward and offline eval measured interleaved, sample by sample, best of
    # --repeats: on a shared machine this keeps other load from skewing one side only.
    target = load_target(target_dir, torch.bfloat16)
    best = {k: 0.0 for k in ("bare", "engine_target", *MODES)}
    recs_all = []
    with torch.inference_mode():
        hf(input_ids=torch.tensor([seqs[0][:32]]))  # warm-up
        eval_sequence(target, drafter, prompts[0][:16], seqs[0][16:40], WalkOptions(budgets=[8]))
        for p, g in zip(prompts, seqs, strict=False):
            per = {k: float("inf") for k in best}
            for _ in range(args.repeats):
                t = time.perf_counter()
                hf(input_ids=torch.tensor([g]))
                per["bare"] = min(per["bare"], time.perf_counter() - t)
                for mode, kw in MODES.items():
                    t = time.perf_counter()
                    rec = eval_sequence(target, drafter, p, g[len(p) :], WalkOptions(**kw))
                    per[mode] = min(per[mode], time.perf_counter() - t)
                    if mode == "all":
                        per["engine_target"] = min(per["engine_target"], rec["seconds"]["target"])
                        rec_all = rec
            for k in best:
                best[k] += per[k]
            recs_all.append(rec_all)
    for (rounds, _c), rec in zip(runs, recs_all, strict=False):
        assert rec["rounds"] == rounds, (
            "offline walk disagrees with the online loop"
        )  # sanity, not timing
    t_bare = best["bare"]
    rows_cost = rows_sensitivity(target, drafter, prompts, seqs, args.repeats)
    del target, hf

    rss = rss_rows(args, target_dir, drafter_dir, prompts, seqs)

    from remote.eval.target import describe

    _c, _meta, info = describe(target_dir)
    tokens = sum(len(g) for g in seqs)
    rounds = sum(len(r) for r, _ in runs)
    print(
        f"setup: target {info.num_layers} layers hidden "
        f"{info.hidden_size} vocab {info.vocab_size}, "
        f"weights {rss[0][3] / 2**20:.0f} MiB bf16; drafter 1 layer, block {drafter.block_size}; "
        f"{args.samples} samples x ({args.prompt} prompt + "
        f"{args.completion} completion) = {tokens} tokens; "
        f"{rounds} online rounds (tau "
        f"{sum(map(sum, (r for r, _ in runs))) / rounds:.2f}); threads {args.threads}"
    )
    print(
        f"bare target forward (HF, full logits): {t_bare:.2f} s "
        f"(best of {args.repeats}, interleaved with the eval runs)"
    )
    for mode in MODES:
        goal = {"all": "goal <= 1.25; ", "all+DDTree": "goal <= 2.0; "}.get(mode, "")
        print(
            f"eval [{mode:10}] wall / bare target forward = "
            f"{best[mode] / t_bare:.2f}   ({goal}eval {best[mode]:.2f} s)"
        )
    print(
        "  of which engine target forward / bare         = "
        f"{best['engine_target'] / t_bare:.2f}   (hooks + text backbone + argmax head)"
    )
    print(
        "  with a drafter that accepts more (m rows of the last layer + head per position, ~tau): "
        + ", ".join(f"m={m}: {t / t_bare:.2f}" for m, t in rows_cost.items())
    )
    body_ddtree(args)
    for mode in MODES:
        goal = f"  (goal >= 5; online {t_online:.1f} s)" if mode == "all" else ""
        print(f"online loop / offline eval [{mode:10}]     = {t_online / best[mode]:.1f}x{goal}")
    print_rss(rss)


def rss_rows(args, target_dir: str, drafter_dir: str, prompts, seqs) -> list[tuple]:
    """(label, peak, runtime, weights) for this target, the bigger dense one, the MoE VLM."""
    rss = [
        (
            "this target",
            *rss_figures(args.workdir, target_dir, drafter_dir, prompts, seqs, args.threads),
        )
    ]
    if args.rss_hidden:
        big = os.path.join(args.workdir, f"rss-{args.rss_hidden}x{args.rss_layers}")
        os.makedirs(big, exist_ok=True)
        big_target, big_drafter = build(big, args.rss_hidden, args.rss_layers, args.vocab)
        rss.append(
            (
                f"{args.rss_hidden} x {args.rss_layers} target",
                *rss_figures(big, big_target, big_drafter, prompts, seqs, args.threads),
            )
        )
    if args.moe_hidden:
        moe = os.path.join(
            args.workdir, f"moe-{args.moe_hidden}x{args.moe_layers}x{args.moe_experts}"
        )
        os.makedirs(moe, exist_ok=True)
        moe_target, moe_drafter = build_moe(
            moe, args.moe_hidden, args.moe_layers, args.moe_experts, args.vocab
        )
        label = f"MoE VLM {args.moe_hidden} x {args.moe_layers}, {args.moe_experts} experts"
        rss.append((label, *rss_figures(moe, moe_target, moe_drafter, prompts, seqs, args.threads)))
    return rss


def print_rss(rss: list[tuple]) -> None:
    for label, peak, base, weights in rss:
        print(
            f"peak RSS of `remote eval` / weights' bytes [{label}] = "
            f"{peak / weights:.2f}   (goal <= 1.3; peak {peak / 2**20:.0f} MiB, "
            f"weights {weights / 2**20:.0f} MiB)"
        )
        print(
            f"  fixed runtime (python+torch+transformers+modeling code) {base / 2**20:.0f} MiB; "
            f"(peak - runtime) / weights = {(peak - base) / weights:.2f}"
        )


# ---- end to end: `dflash remote-eval` against a plain transformers generate script ----------

PLAIN_GENERATE = """
import time
marks = [time.perf_counter()]  # where its time goes; marks only, the work is unchanged
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
marks.append(time.perf_counter())
target, prompts, new, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
tok = AutoTokenizer.from_pretrained(target)
marks.append(time.perf_counter())
model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
marks.append(time.perf_counter())
looping = 0.0
for line in open(prompts):
    text = json.loads(line)["turns"][0]
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
    ids = torch.tensor([tok(rendered, add_special_tokens=False)["input_ids"]])
    t = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=new)
    looping += time.perf_counter() - t
marks.append(time.perf_counter())
parts = [b - a for a, b in zip(marks, marks[1:])]
print(json.dumps({"generate_s": looping, "modules": sorted(sys.modules), "phases": {
    "imports (torch, transformers' names)": parts[0], "tokenizer": parts[1],
    "from_pretrained (model's code import, weights)": parts[2],
    "prompts: render, tokenize": parts[3] - looping, "generate": looping}}))
"""

# Two definitions of "one python+torch+transformers import", both timed in every round.
# NARROW (the benchmark's first one): the top-level names, which transformers resolves
# lazily, so it leaves out the model's own code. FAIR: what the plain script above must
# import to run the same model: torch, transformers, the model class its config maps to
# (its modeling module and what that pulls in: masking_utils -> torch._dynamo, weight
# loading -> torch.distributed.tensor, ...), the tokenizer classes and generate; no
# weights, no tokenizer files, no generation. It prints its modules, so the benchmark can
# show the plain script imports nothing it leaves out.
NARROW_IMPORTS = (
    "import torch, transformers; from transformers import AutoModelForCausalLM, AutoTokenizer"
)
FAIR_IMPORTS = """
import json, sys
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
import transformers.generation.utils
config = AutoConfig.from_pretrained(sys.argv[1])
AutoModelForCausalLM._model_mapping[type(config)]  # imports the model's modeling module
import transformers.tokenization_utils_tokenizers
print(json.dumps({"modules": sorted(sys.modules)}))
"""


def e2e_row(args) -> None:
    """`dflash remote-eval` (CLI start, ssh to a loopback eval host, detached job, local
    ground truth, the engine, the pull) against a plain transformers ``generate`` script over
    the same prompts on the same host, in interleaved rounds; the job's fixed cost beside one
    python+torch+transformers import."""
    import shutil
    import statistics
    import tempfile
    from pathlib import Path

    import yaml

    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.sshd import SSHServer, keygen
    from orchestrator.demo.train import train_drafter

    base = Path(tempfile.mkdtemp(prefix="dflash-e2e-"))
    target = build_qwen3_target(
        str(base / "target"),
        hidden_size=args.e2e_hidden,
        num_layers=args.e2e_layers,
        num_heads=8,
        num_kv_heads=4,
    )
    train_drafter(target, str(base / "drafters"), save_steps=(0,), samples=2)
    prompts = base / "prompts.jsonl"
    src = Path(__file__).resolve().parent.parent / "orchestrator/data/prompts/chat.jsonl"
    prompts.write_text("".join(src.read_text().splitlines(True)[: args.samples]))
    key = keygen(base / "id")
    (base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    server = SSHServer.start(base, "evalhost", base / "authorized_keys")
    try:
        (base / "known_hosts").write_text(server.known_hosts_line())
        workdir = server.root / "dflash"
        inv = base / "inventory.yaml"
        inv.write_text(
            yaml.safe_dump(
                {
                    "hosts": {
                        "evalhost": {
                            "transport": "ssh",
                            "hostname": "127.0.0.1",
                            "port": server.port,
                            "user": os.environ.get("USER") or "root",
                            "identity_file": str(key),
                            "known_hosts": str(base / "known_hosts"),
                            "python": sys.executable,
                            "workdir": str(workdir),
                            "roles": {
                                "eval": {
                                    "drafters": str(base / "drafters"),
                                    "target_model": target,
                                    "ground_truth_kind": "local",
                                    "dtype": "float32",
                                    "threads": args.threads,
                                    "max_new_tokens": args.e2e_new,
                                }
                            },
                        }
                    },
                    "defaults": {"eval_host": "evalhost", "results_dir": str(base / "results")},
                }
            )
        )
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=root)
        plain = [
            sys.executable,
            "-c",
            PLAIN_GENERATE,
            target,
            str(prompts),
            str(args.e2e_new),
            str(args.threads),
        ]
        dflash = [
            sys.executable,
            "-m",
            "orchestrator",
            "remote-eval",
            "--checkpoint",
            "step-0",
            "--prompts",
            str(prompts),
            "--budgets",
            "8,16,32,64",
            *(
                ["--gt-concurrency", str(args.e2e_gt_concurrency)]
                if args.e2e_gt_concurrency
                else []
            ),
            "--json",
            "-i",
            str(inv),
        ]
        imports = [sys.executable, "-c", NARROW_IMPORTS]
        fair = [sys.executable, "-c", FAIR_IMPORTS, target]

        def timed(argv: list[str]) -> tuple[float, str]:
            t = time.perf_counter()
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
            if out.returncode:
                raise SystemExit(f"{argv[:4]} failed: {(out.stderr or out.stdout)[-400:]}")
            return time.perf_counter() - t, out.stdout

        times: dict[str, list[float]] = {
            "plain": [],
            "dflash": [],
            "import": [],
            "fair": [],
            "other": [],
        }
        fixed, work, phases, plain_fixed, uncovered = [], [], [], [], set()
        plain_phases: list[dict[str, float]] = []
        # Untimed, once: the first remote-eval on a host pushes the bundle (once per dflash
        # version and host, not per job), and both sides' first runs read cold files.
        timed(plain)
        timed(dflash)
        for _ in range(args.repeats):
            times["import"].append(timed(imports)[0])
            took, out = timed(fair)
            times["fair"].append(took)
            fair_modules = set(json.loads(out.splitlines()[-1])["modules"])
            took, out = timed(plain)
            times["plain"].append(took)
            answer = json.loads(out.splitlines()[-1])
            plain_fixed.append(took - answer["generate_s"])
            plain_phases.append(
                {"python start, exit": took - sum(answer["phases"].values()), **answer["phases"]}
            )
            uncovered |= set(answer["modules"]) - fair_modules
            shutil.rmtree(workdir / "groundtruth", ignore_errors=True)  # generate it each time
            began = time.time()
            took, out = timed(dflash)
            ended = began + took
            times["dflash"].append(took)
            row = e2e_phases(Path(json.loads(out)["run_dir"]), began, ended)
            if args.e2e_other_tree:  # the same command from another source tree, same round
                shutil.rmtree(workdir / "groundtruth", ignore_errors=True)
                other_env = dict(env, PYTHONPATH=args.e2e_other_tree)
                t = time.perf_counter()
                done = subprocess.run(dflash, env=other_env, capture_output=True, timeout=900)
                if done.returncode:
                    raise SystemExit(f"{args.e2e_other_tree}: {done.stderr[-400:]!r}")
                times["other"].append(time.perf_counter() - t)
            phases.append(row)
            # Work: what grows with prompts and tokens (the ground truth's generation loop,
            # the engine's eval loop); everything else is the job's fixed cost.
            work.append(row["ground truth: generate"] + row["engine: eval loop"])
            fixed.append(took - work[-1])
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"end to end: target Qwen3 hidden {args.e2e_hidden}, {args.e2e_layers} layers; "
        f"{args.samples} chat prompts x {args.e2e_new} new tokens, local ground truth, budgets "
        f"8,16,32,64; float32; {args.threads} threads; ground truth "
        f"{args.e2e_gt_concurrency or 'default (16)'} prompts per generate; median of "
        f"{args.repeats} interleaved rounds after one untimed run of each; load avg {load}"
    )
    print("  phases of dflash remote-eval (median s; CLI and host share this machine's clock):")
    for name in phases[0]:
        print(f"    {name:<48} {statistics.median(p[name] for p in phases):6.2f}")
    print("  phases of the plain generate script (median s):")
    for name in plain_phases[0]:
        print(f"    {name:<48} {statistics.median(p[name] for p in plain_phases):6.2f}")
    print(f"  plain transformers generate script: {med['plain']:6.2f} s")
    print(f"  dflash remote-eval (CLI to result): {med['dflash']:6.2f} s")
    print(
        "  rounds (plain, dflash): "
        + ", ".join(
            f"({a:.1f}, {b:.1f})" for a, b in zip(times["plain"], times["dflash"], strict=True)
        )
    )
    ratios = [b / a for a, b in zip(times["plain"], times["dflash"], strict=True)]
    print(
        f"  remote-eval / plain generate      = {statistics.median(ratios):.2f}  (goal <= 1.0; "
        f"median of the per-round ratios)"
    )
    if times["other"]:
        other = [b / a for a, b in zip(times["plain"], times["other"], strict=True)]
        mine = [d / o for d, o in zip(times["dflash"], times["other"], strict=True)]
        print(
            f"  same command from {args.e2e_other_tree}: {statistics.median(times['other']):.2f}"
            f" s; / plain generate = {statistics.median(other):.2f}; this tree / that tree = "
            f"{statistics.median(mine):.2f}"
        )
    extra = [f - i for f, i in zip(fixed, times["import"], strict=True)]
    extra_fair = [f - i for f, i in zip(fixed, times["fair"], strict=True)]
    print(
        "  fixed cost (wall less the generate and eval loops) "
        f"{statistics.median(fixed):.2f} s; above one python+torch+transformers import "
        "(goal <= 3 s):"
    )
    print(
        f"    fair: the imports the plain script needs for this model "
        f"{med['fair']:.2f} s: +{statistics.median(extra_fair):.2f} s  (the plain script "
        f"imports {len(uncovered)} module(s) beyond it"
        + (f": {', '.join(sorted(uncovered)[:5])}" if uncovered else "")
        + ")"
    )
    print(
        f"    old, narrow: `{NARROW_IMPORTS}` {med['import']:.2f} s: "
        f"+{statistics.median(extra):.2f} s  (lazy names: no modeling code, which both "
        "sides must import)"
    )
    # The plain script's own fixed cost (its wall less its generate calls: the same imports,
    # the model's code, the load), for scale: what any eval on this host pays at least.
    beyond = [f - p for f, p in zip(fixed, plain_fixed, strict=True)]
    print(
        f"  the plain script's fixed cost {statistics.median(plain_fixed):.2f} s (imports, "
        f"the model's code, the load): dflash's less it {statistics.median(beyond):+.2f} s"
    )


def e2e_phases(run_dir, began: float, ended: float) -> dict[str, float]:
    """Where one `dflash remote-eval` went, from the clocks its files carry: the spec's
    ``created`` (controller), ``pid.json`` (the spawn), the job's events, the ground truth's
    and the engine's own timings, ``pulled.json``; `began`/`ended` bracket the CLI."""
    from pathlib import Path

    run_dir = Path(run_dir)

    def read(name: str) -> dict:
        return json.loads((run_dir / name).read_text())

    spec, gt, result, pulled = (
        read(n) for n in ("spec.json", "ground_truth.json", "result.json", "pulled.json")
    )
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    at: dict[str, float] = {}
    for e in events:
        at.setdefault(e.get("phase") or e["event"], e["time"])
    job_dir = Path(spec["workdir"]) / "jobs" / spec["job_id"]
    spawned = json.loads((job_dir / "pid.json").read_text())["started"]
    checks = json.loads((job_dir / "preflight.json").read_text())["seconds"]
    timings = result["timings"]
    gt_gen = float(gt.get("seconds") or 0.0)
    loads = timings["load_target_s"] + timings["load_drafter_s"]
    preflight = at["ground_truth"] - at["job"]
    return {
        "CLI start, ssh login, spec": spec["created"] - began,
        "job start command (to the runner's spawn)": spawned - spec["created"],
        "runner start (python, to its first event)": at["job"] - spawned,
        "host: torch + transformers import": checks["import_s"],
        "host: model's code import, meta model": checks["describe_s"],
        "host: other checks (files, RAM, load plan)": preflight
        - checks["import_s"]
        - checks["describe_s"],
        "ground truth: tokenizer, model load": at["eval"] - at["ground_truth"] - gt_gen,
        "ground truth: generate": gt_gen,
        "engine: checks, loads, result write": at["end"] - at["eval"] - timings["eval_s"],
        "engine: eval loop": timings["eval_s"],
        "end to pulled (watch, pull)": pulled["pulled"] - at["end"],
        "pulled to CLI exit (plots, summary)": ended - pulled["pulled"],
        "(of which the engine's model loads)": loads,
    }


if __name__ == "__main__":
    main()
