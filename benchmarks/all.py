"""Run every benchmark once, one after the other, and keep what each printed.

    python benchmarks/all.py                  # the sizes benchmarks/README.md's figures use
    python benchmarks/all.py --quick          # smallest sizes: a smoke run of every script
    python benchmarks/all.py --only relay,eval --out run.md

Each benchmark measures its own baselines in the same run and prints ratios; this runner
only sequences them, so their figures come from one sitting on one machine, and records
the load average (1, 5, 15 min) before and after each, since a busy box moves every ratio.
It writes a Markdown file (``--out``; default a new file in the temporary folder, never
benchmarks/results.md, whose dated entries are kept by hand). Nothing here asserts a
figure: a goal not met is a line of output. A benchmark that fails is reported with its
exit code and the run goes on to the next one.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT
from common.measure import load_avg

# The trained pair's smallest set-up (`common.pair`): trained once for 30 steps (3
# checkpoints, feature_cache.py's A, B, C), then cached.
PAIR = "--samples 2 --train-samples 2 --prompt 32 --completion 64 --train-steps 30"
PAIR += " --save-every 10 --tau 99 --repeats 1 --budgets 8"
SMALL = "--hidden 256 --layers 4 --vocab 4096 --samples 1 --prompt 32 --completion 32"

# name -> (script and its arguments at the issues' sizes, the same at the smallest sizes)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "relay": ("relay.py", "relay.py --size-scale 0.02 --rounds 1"),
    "relay-kill-resume": ("relay_kill_resume.py", "relay_kill_resume.py --kills 4"),
    "relay-cpu": ("relay_cpu.py", "relay_cpu.py --size-mib 32 --fixed-mib 8"),
    "groundtruth": ("groundtruth.py", "groundtruth.py --prompts 8 --rounds 1"),
    "eval": ("eval.py", f"eval.py {SMALL} --repeats 1"),
    "eval-ddtree": (
        "eval.py --ddtree-only",
        f"eval.py --ddtree-only {SMALL} --repeats 1 --body-hidden 256 --body-layers 4 "
        "--body-vocab 2048",
    ),
    "eval-growth": (
        "eval.py --completion 128,256,512,1024 --samples 1",
        f"eval.py {SMALL} --repeats 1 --completion 32,64",
    ),
    "eval-e2e": ("eval_e2e.py --samples 8", "eval_e2e.py --samples 2 --repeats 1 --new 8"),
    "context": ("context.py", "context.py --shapes tiny --contexts 1k,4k --completion 16"),
    "memory": (
        "memory.py",
        f"memory.py {SMALL} --rss-hidden 0 --moe-hidden 256 --moe-layers 2 --moe-experts 8 --mib 8",
    ),
    "eval-drafter-share": ("eval_drafter_share.py", f"eval_drafter_share.py {PAIR}"),
    "drafter-share-realwidth": (
        "drafter_share_realwidth.py",
        f"drafter_share_realwidth.py {PAIR} --sample-counts 2 --real-layers 1",
    ),
    "feature-cache": ("feature_cache.py", f"feature_cache.py {PAIR}"),
    "cpu-bf16": ("cpu_bf16.py", f"cpu_bf16.py {PAIR}"),
    "widen-buffer": ("widen_buffer.py", "widen_buffer.py --rows 1,16 --repeats 1"),
    "sampling": (f"sampling.py {PAIR} --repeats 3", f"sampling.py {PAIR}"),
    "eval-threads": ("eval_threads.py", "eval_threads.py --repeats 1 --samples 2 --tokens 16"),
    "scale": (
        "scale.py",
        "scale.py --samples 4 --hidden 256 --layers 2 --completion 32 --repeats 1",
    ),
    "speedup": (
        "speedup.py --budgets 4 16",
        "speedup.py --hidden 128 --new-tokens 16 --prompts 2 --budgets 4",
    ),
    "realscale": (
        "realscale.py",
        "realscale.py --layers 2 --samples 1 --prompt 32 --completion 32 --repeats 1 --budgets 8",
    ),
    "online": ("online.py", "online.py"),
    "slurm-startup": ("slurm_startup.py", "slurm_startup.py --tasks 1,4 --repeats 1"),
}


def run_one(argv: list[str], timeout: float) -> tuple[str, int, float, str, str]:
    before = load_avg()
    t = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        rc, text = proc.returncode, proc.stdout + (proc.stderr if proc.returncode else "")
    except subprocess.TimeoutExpired as e:
        rc, text = 124, (e.stdout or b"").decode(errors="replace") + "\n(timed out)\n"
    return before, rc, time.perf_counter() - t, load_avg(), text


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="comma-separated names: " + ",".join(BENCHMARKS))
    ap.add_argument("--quick", action="store_true", help="each at its smallest sizes")
    ap.add_argument("--out", default=None, help="the Markdown file to write")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    if unknown := [n for n in names if n not in BENCHMARKS]:
        print(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
        return 2
    out = Path(args.out or tempfile.mkstemp(prefix="dflash-bench-", suffix=".md")[1])
    lines = [
        f"# Benchmark results (one run{', quick sizes' if args.quick else ''})",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, python {platform.python_version()}; "
        f"load average before: {load_avg()}",
        "",
    ]
    failed = 0
    for name in names:
        argv = BENCHMARKS[name][args.quick].split()
        argv[0] = f"benchmarks/{argv[0]}"
        print(f"== {name}: {' '.join(argv)}", flush=True)
        before, rc, secs, after, text = run_one(argv, args.timeout)
        print(text, flush=True)
        failed += rc != 0
        status = "" if rc == 0 else f", FAILED (exit {rc})"
        lines += [
            f"## {name}",
            "",
            f"`python {' '.join(argv)}`: {secs:.0f} s; load average {before} before, "
            f"{after} after{status}",
            "",
            "```",
            text.rstrip(),
            "```",
            "",
        ]
        out.write_text("\n".join(lines))  # as it goes: a long sitting keeps what it measured
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
