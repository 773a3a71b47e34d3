"""The end-to-end row of `benchmarks/eval.py`: `dflash remote-eval` (CLI start, ssh to a
loopback eval host, detached job, local ground truth, the engine, the pull) against a
plain transformers ``generate`` script over the same prompts on the same host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="dflash-e2e-"))
    target, prompts, server, key = _e2e_models_and_host(args, base)
    try:
        inv, workdir = _e2e_inventory(args, base, server, key, target)
        measured = _e2e_rounds(args, target, prompts, inv, workdir)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    _print_e2e(args, **measured)


def _e2e_models_and_host(args, base):
    """The target (a Qwen3 of ``--e2e-*``), a step-0 drafter trained on it, the prompts
    file, a loopback sshd eval host and the key it accepts, all under `base`."""
    from pathlib import Path

    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.sshd import SSHServer, keygen
    from orchestrator.demo.train import train_drafter

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
    (base / "known_hosts").write_text(server.known_hosts_line())
    return target, prompts, server, key


def _e2e_inventory(args, base, server, key, target):
    """The inventory naming the loopback eval host (local ground truth), and its workdir."""
    import yaml

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
    return inv, workdir


def _e2e_rounds(args, target, prompts, inv, workdir) -> dict:
    """Time the plain script, remote-eval and the two imports in interleaved rounds; what
    `_print_e2e` prints."""
    import shutil
    from pathlib import Path

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
        *(["--gt-concurrency", str(args.e2e_gt_concurrency)] if args.e2e_gt_concurrency else []),
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
    import statistics

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
