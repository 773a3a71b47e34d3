"""Is ``dflash remote-eval`` end to end as quick as a plain transformers ``generate`` script?

    python benchmarks/eval_e2e.py [--samples 8] [--repeats 2] [--baseline REV]

`dflash remote-eval` (CLI start, ssh to a loopback eval host, detached job, local ground
truth, the engine, the pull) against a plain ``generate`` script over the same chat prompts
on the same host, in interleaved rounds after one untimed run of each (a fresh host's first
remote-eval pushes the bundle): each side's phases, remote-eval / plain (goal <= 1.0), and
the job's fixed cost above one python+torch+transformers import (goal <= 3 s), timed two
ways: the narrow import (transformers' lazy names) and the fair one (what the plain script
needs for this model; the benchmark checks the script imports nothing beyond it).
``--baseline REV`` also times that revision's remote-eval (a git worktree) in every round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from common import ROOT
from common.baseline import worktree
from common.hosts import inventory, loopback
from common.measure import goal, load_avg

from orchestrator.demo.models import build_qwen3_target
from orchestrator.demo.train import train_drafter

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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samples", type=int, default=8, help="chat prompts")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    ap.add_argument("--gt-concurrency", type=int, help="prompts per local generate call")
    ap.add_argument("--baseline", help="also time this revision's remote-eval (a commit)")
    args = ap.parse_args()
    with ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dflash-e2e-")))
        other = stack.enter_context(worktree(args.baseline)) if args.baseline else None
        servers = stack.enter_context(loopback(base, ("evalhost",)))
        target = build_qwen3_target(
            str(base / "target"),
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=8,
            num_kv_heads=4,
        )
        train_drafter(target, str(base / "drafters"), save_steps=(0,), samples=2)
        prompts = base / "prompts.jsonl"
        src = ROOT / "orchestrator/data/prompts/chat.jsonl"
        prompts.write_text("".join(src.read_text().splitlines(True)[: args.samples]))
        role = {
            "drafters": str(base / "drafters"),
            "target_model": target,
            "ground_truth_kind": "local",
            "dtype": "float32",
            "threads": args.threads,
            "max_new_tokens": args.new,
        }
        inv = inventory(
            base,
            servers,
            {"evalhost": {"eval": role}},
            {"eval_host": "evalhost", "results_dir": str(base / "results")},
        )
        workdir = servers["evalhost"].root / "dflash"
        measured = _e2e_rounds(args, target, prompts, inv, workdir, other)
    _print_e2e(args, **measured)


def _e2e_rounds(args, target, prompts, inv, workdir, other: Path | None) -> dict:
    """Time the plain script, remote-eval and the two imports in interleaved rounds; what
    `_print_e2e` prints; ``other``: a baseline's worktree, whose remote-eval runs too."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    plain = [
        sys.executable,
        "-c",
        PLAIN_GENERATE,
        target,
        str(prompts),
        str(args.new),
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
        *(["--gt-concurrency", str(args.gt_concurrency)] if args.gt_concurrency else []),
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
        if other:  # the same command from the baseline's tree, same round
            shutil.rmtree(workdir / "groundtruth", ignore_errors=True)
            other_env = dict(env, PYTHONPATH=str(other))
            t = time.perf_counter()
            done = subprocess.run(dflash, env=other_env, capture_output=True, timeout=900)
            if done.returncode:
                raise SystemExit(f"{args.baseline}: {done.stderr[-400:]!r}")
            times["other"].append(time.perf_counter() - t)
        phases.append(row)
        # Work: what grows with prompts and tokens (the ground truth's generation loop,
        # the engine's eval loop); everything else is the job's fixed cost.
        work.append(row["ground truth: generate"] + row["engine: eval loop"])
        fixed.append(took - work[-1])
    return {
        "times": times,
        "fixed": fixed,
        "phases": phases,
        "plain_phases": plain_phases,
        "plain_fixed": plain_fixed,
        "uncovered": uncovered,
    }


def _print_e2e(args, times, fixed, phases, plain_phases, plain_fixed, uncovered) -> None:
    """The end-to-end rows: each side's phases, the per-round ratio, the fixed cost."""
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(
        f"end to end: target Qwen3 hidden {args.hidden}, {args.layers} layers; "
        f"{args.samples} chat prompts x {args.new} new tokens, local ground truth, budgets "
        f"8,16,32,64; float32; {args.threads} threads; ground truth "
        f"{args.gt_concurrency or 'default (16)'} prompts per generate; median of "
        f"{args.repeats} rounds after one untimed run of each; load avg {load_avg()}"
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
    ratio = statistics.median(ratios)
    goal("  remote-eval / plain generate", ratio, "<=", 1.0, "median of the per-round ratios")
    if times["other"]:
        other = [b / a for a, b in zip(times["plain"], times["other"], strict=True)]
        mine = [d / o for d, o in zip(times["dflash"], times["other"], strict=True)]
        print(
            f"  same command from {args.baseline}: {statistics.median(times['other']):.2f}"
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
