"""Benchmark the online measurement against the offline engine, same checkpoint and prompts.

On the tiny Qwen3 target and the one-layer DFlash drafter of `orchestrator.demo.vllm` (built
and cached on first use): vLLM's server start-up (the online measurement's fixed cost), its
measurement of the 24 ground-truth samples (`remote.online.vllm.measure`: per-token cost),
and our offline engine (`remote.eval.engine.run_eval`, float32) on the same samples. Prints
the times, the ratios online / offline and the load average beside them (this box is
shared: ratios measured in the same run are what to compare).

    python benchmarks/online.py [--drafter one-layer|two-layer]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.demo.vllm import VllmServer, vllm_models  # noqa: E402
from remote.online.vllm import measure  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="one-layer")
    args = ap.parse_args()
    models = vllm_models()
    drafter = models.drafters[args.drafter][-1]
    rows = models.rows()
    tokens = sum(len(r["completion_ids"]) for r in rows)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"load before: {load()}")
        from remote.eval.engine import run_eval
        from remote.protocol import EvalSpec

        t0 = time.perf_counter()
        result = run_eval(
            EvalSpec.from_json(
                {
                    "target": str(models.target),
                    "drafter": str(drafter),
                    "ground_truth": str(models.ground_truth),
                    "output_dir": str(Path(tmp) / "off"),
                    "dtype": "float32",
                    "threads": 1,  # as vLLM runs here: one OpenMP thread
                }
            ),
            on_event=lambda _e: None,
        )
        offline_total = time.perf_counter() - t0
        offline_eval = result["timings"]["eval_s"]
        print(
            f"offline engine: {offline_total:.2f} s in all, {offline_eval:.3f} s walking "
            f"{len(rows)} samples ({tokens} tokens)  (load {load()})"
        )
        t0 = time.perf_counter()
        with VllmServer(models.target, Path(tmp), drafter) as server:
            startup = time.perf_counter() - t0
            run = measure(server.url, rows, 320)
        online_total = time.perf_counter() - t0
        per_token = run["seconds"] / run["tokens"]
        print(
            f"vLLM: start-up {startup:.1f} s, measurement {run['seconds']:.2f} s for "
            f"{run['tokens']} tokens = {1000 * per_token:.2f} ms/token, "
            f"{online_total:.1f} s in all  (load {load()})"
        )
        print(
            f"ratios: online measurement / offline walk {run['seconds'] / offline_eval:.1f}x, "
            f"online in all / offline in all {online_total / offline_total:.1f}x, "
            f"start-up / measurement {startup / run['seconds']:.1f}x"
        )


if __name__ == "__main__":
    main()
