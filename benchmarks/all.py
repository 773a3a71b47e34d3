"""Run every benchmark once, one after the other, and keep what each printed.

    python benchmarks/all.py                  # the scales of benchmarks/README.md's figures
    python benchmarks/all.py --only relay,eval
    python benchmarks/all.py --out benchmarks/results.md

Each benchmark measures its own baselines in the same run and prints ratios; this runner only
sequences them, so their figures come from one sitting on one machine, and prints the load
average (1, 5, 15 min) before and after each one, since a busy box moves every ratio. The
output is a Markdown file (default ``benchmarks/results.md``) that benchmarks/README.md
quotes. Nothing here asserts a figure: a goal not met is a line in the output, not a failure.
A benchmark that fails is reported with its exit code and the run goes on to the next one.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> arguments. Sizes are the ones the goals name where that fits in a few
# minutes on a 2-core box; each script's own --help says what the flags mean.
BENCHMARKS: dict[str, list[str]] = {
    "relay": ["benchmarks/relay.py"],
    "groundtruth": ["benchmarks/groundtruth.py"],
    "eval": ["benchmarks/eval.py"],
    "eval-ddtree": ["benchmarks/eval.py", "--ddtree-only"],
    "eval-growth": ["benchmarks/eval.py", "--completion", "128,256,512,1024", "--samples", "1"],
    "eval-e2e": ["benchmarks/eval.py", "--e2e", "--samples", "8"],
    "eval-drafter-share": ["benchmarks/eval_drafter_share.py"],
    "eval-heap": ["benchmarks/eval_heap.py"],
    "eval-pool": ["benchmarks/eval_pool.py", "--samples", "8", "--pool", "2"],
    "feature-cache": ["benchmarks/feature_cache.py"],
    "scale": ["benchmarks/scale.py"],
    "probe": ["benchmarks/probe.py"],
}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_one(argv: list[str], timeout: float) -> tuple[str, int, float, str, str]:
    before = load()
    t = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        rc, text = proc.returncode, proc.stdout + (proc.stderr if proc.returncode else "")
    except subprocess.TimeoutExpired as e:
        rc, text = 124, (e.stdout or b"").decode(errors="replace") + "\n(timed out)\n"
    return before, rc, time.perf_counter() - t, load(), text


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="", help="comma-separated names: " + ",".join(BENCHMARKS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results.md"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
        return 2

    lines = [
        "# Benchmark results (one run)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, python {platform.python_version()}; "
        f"load average before: {load()}",
        "",
    ]
    failed = 0
    for name in names:
        argv = BENCHMARKS[name]
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
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
