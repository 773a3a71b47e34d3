"""What does the online measurement (a vLLM server) cost against the offline engine, and
what do its extras cost against one online run?

    python benchmarks/online.py [--drafter one-layer|two-layer] [--only measure,job,extras]

On the tiny Qwen3 target and the DFlash drafters of `orchestrator.demo.vllm` (built and
cached on first use), its 24 ground-truth samples x 40 tokens, float32, one thread (as
vLLM runs here: one OpenMP thread):

* ``measure``: vLLM's start-up (the online measurement's fixed cost) and its measurement
  of the samples (`remote.online.vllm.measure`: the per-token cost), against the offline
  engine (`remote.eval.engine.run_eval`) on the same samples;
* ``job``: ``dflash online`` end to end (the chain walk, plus vLLM started on the host's
  loopback and every prompt through it) against ``dflash remote-eval`` (the chain walk
  only), over a loopback sshd eval host, each from the command's start to its end, after
  one untimed remote-eval (it pushes the bundle);
* ``extras``: against one online run (vLLM's start-up and one measurement at concurrency
  1), what ``--concurrency 1,4,16`` adds (levels 4 and 16 on the same server), what
  ``--baseline`` adds (a server without the drafter started and measured at 1, 4, 16), and
  what the deviation check adds (the two-layer drafter, whose rounds vLLM 0.32 changes:
  the offline walk re-run with the k_norm deviation simulated on the differing samples,
  loads included); with the figures each gives (tokens/s per level, speedup, confirmed).

Prints the times, the ratios and the load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT
from common.hosts import inventory, loopback
from common.measure import load_avg

from orchestrator.demo.vllm import VllmServer, vllm_models, vllm_python


def measure_rows(models, drafter: Path) -> None:
    """vLLM's start-up and measurement against the offline engine's eval."""
    from remote.eval.engine import run_eval
    from remote.online.vllm import measure
    from remote.protocol import EvalSpec

    rows = models.rows()
    tokens = sum(len(r["completion_ids"]) for r in rows)
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "target": str(models.target),
            "drafter": str(drafter),
            "ground_truth": str(models.ground_truth),
            "output_dir": str(Path(tmp) / "off"),
            "dtype": "float32",
            "threads": 1,
        }
        t0 = time.perf_counter()
        result = run_eval(EvalSpec.from_json(spec), on_event=lambda _e: None)
        offline_total = time.perf_counter() - t0
        offline_eval = result["timings"]["eval_s"]
        print(
            f"offline engine: {offline_total:.2f} s in all, {offline_eval:.3f} s walking "
            f"{len(rows)} samples ({tokens} tokens)  (load {load_avg()})"
        )
        t0 = time.perf_counter()
        with VllmServer(models.target, Path(tmp), drafter) as server:
            startup = time.perf_counter() - t0
            run = measure(server.url, rows, 320)
        online_total = time.perf_counter() - t0
    print(
        f"vLLM: start-up {startup:.1f} s, measurement {run['seconds']:.2f} s for "
        f"{run['tokens']} tokens = {1000 * run['seconds'] / run['tokens']:.2f} ms/token, "
        f"{online_total:.1f} s in all  (load {load_avg()})"
    )
    print(
        f"ratios: online measurement / offline walk {run['seconds'] / offline_eval:.1f}x, "
        f"online in all / offline in all {online_total / offline_total:.1f}x, "
        f"start-up / measurement {startup / run['seconds']:.1f}x"
    )


def extras_rows(models) -> None:
    """What --concurrency 1,4,16, --baseline and the deviation check cost against one online
    run (vLLM started, the prompts measured once), on the two-layer drafter."""
    from remote.eval.engine import run_eval
    from remote.online import report
    from remote.online.server import engine_version
    from remote.online.simulate import check_deviations
    from remote.online.vllm import measure
    from remote.protocol import EvalSpec

    rows = models.rows()
    drafter = models.drafters["two-layer"][-1]
    levels = (1, 4, 16)
    with tempfile.TemporaryDirectory() as tmp:
        spec = EvalSpec.from_json(
            {
                "target": str(models.target),
                "drafter": str(drafter),
                "ground_truth": str(models.ground_truth),
                "output_dir": str(Path(tmp) / "off"),
                "dtype": "float32",
                "threads": 1,
            }
        )
        run_eval(spec, on_event=lambda _e: None)
        offline = [
            json.loads(x) for x in (Path(tmp) / "off" / "samples.jsonl").read_text().splitlines()
        ]
        t0 = time.perf_counter()
        with VllmServer(models.target, Path(tmp), drafter, max_num_seqs=16) as server:
            startup = time.perf_counter() - t0
            runs = [
                {"concurrency": c, **measure(server.url, rows, 320, concurrency=c)} for c in levels
            ]
            info = {
                "engine": "vllm",
                "url": server.url,
                "version": engine_version(server.url),
                "platform": server.platform(),
            }
        one_run = startup + runs[0]["seconds"]
        t0 = time.perf_counter()
        with VllmServer(models.target, Path(tmp), max_num_seqs=16) as plain:
            plain_startup = time.perf_counter() - t0
            base = [
                {"concurrency": c, **measure(plain.url, rows, 320, concurrency=c)} for c in levels
            ]
        plain_s = time.perf_counter() - t0
        v = report.build(
            rows,
            offline,
            {"levels": runs, "server": info},
            {"levels": base, "started_here": True, "url": plain.url, "startup_s": plain_startup},
            block_size=4,
            offline_dtype="float32",
            online_dtype="float32",
        )
        t0 = time.perf_counter()
        check_deviations(v, "vllm", spec, 2, rows)
        deviation_s = time.perf_counter() - t0
    more = sum(r["seconds"] for r in runs[1:])
    print(
        f"one online run: {one_run:.1f} s (start-up {startup:.1f} s, measurement "
        f"{runs[0]['seconds']:.2f} s)  (load {load_avg()})"
    )
    for lv in v["levels"]:
        print(
            f"  concurrency {lv['concurrency']:>2}: tau {lv['tau_token_weighted']:.3f}, rounds as "
            f"the first {lv['same_rounds_as_first'] or '-'}, {lv['tokens_per_s']:.0f} tokens/s, "
            f"without the drafter {lv['baseline_tokens_per_s']:.0f}, speedup {lv['speedup']:.2f}x"
        )
    dev = v["deviations"][0]
    print(
        f"--concurrency 1,4,16 adds {more:.2f} s = {more / one_run:.1%} of one online run; "
        f"--baseline adds {plain_s:.1f} s (start-up {plain_startup:.1f} s) = "
        f"{plain_s / one_run:.2f}x one online run; the deviation check adds {deviation_s:.1f} s "
        f"= {deviation_s / one_run:.1%} ({dev['name']}: {dev['status']}, {dev['reproduced']} of "
        f"{dev['tested']} differing samples; verdict {v['verdict']})  (load {load_avg()})"
    )


def timed(*args: str) -> tuple[float, dict]:
    """Run ``dflash ARGS --json``; its wall time and its JSON answer."""
    t0 = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=1800,
    )
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        sys.exit(f"dflash {' '.join(args)} failed: {run.stderr.strip().splitlines()[-1:]}")
    return seconds, json.loads(run.stdout)


def job_rows(models, drafter: Path) -> None:
    """``dflash online`` end to end against ``dflash remote-eval``."""
    with tempfile.TemporaryDirectory(prefix="dflash-online-") as tmp:
        base = Path(tmp)
        with loopback(base, ("evalhost",)) as servers:
            role = {
                "drafters": str(drafter.parent),
                "target_model": str(models.target),
                "ground_truth": str(models.ground_truth),
                "ground_truth_kind": "file",
                "dtype": "float32",
                "threads": 1,
                "serve": {"engine": "vllm", "python": str(vllm_python()), "kv_cache_gib": 1},
            }
            defaults = {"eval_host": "evalhost", "results_dir": str(base / "r")}
            inv = inventory(base, servers, {"evalhost": {"eval": role}}, defaults)
            which = ("-c", drafter.name, "-i", str(inv))
            timed("remote-eval", *which, "--budgets", "", "--samples", "1")  # pushes the bundle
            offline_s, _ = timed("remote-eval", *which, "--budgets", "")
            print(f"remote-eval (chain walk): {offline_s:.1f} s  (load {load_avg()})")
            online_s, out = timed("online", *which)
    v = out["verdict"]
    srv = v["server"]
    print(
        f"online: {online_s:.1f} s, verdict {v['verdict']}; server start-up "
        f"{srv['startup_s']:.1f} s, measurement {srv['seconds']:.2f} s for {srv['tokens']} "
        f"tokens = {1000 * srv['seconds'] / srv['tokens']:.2f} ms/token  (load {load_avg()})"
    )
    print(
        f"ratios: online / remote-eval {online_s / offline_s:.1f}x; start-up / measurement "
        f"{srv['startup_s'] / srv['seconds']:.1f}x; start-up / the whole online run "
        f"{srv['startup_s'] / online_s:.0%}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--drafter", default="one-layer")
    ap.add_argument("--only", default="measure,job,extras", help="some of: measure, job, extras")
    args = ap.parse_args()
    models = vllm_models()
    drafter = models.drafters[args.drafter][-1]
    print(f"load before: {load_avg()}")
    if "measure" in args.only.split(","):
        measure_rows(models, drafter)
    if "job" in args.only.split(","):
        job_rows(models, drafter)
    if "extras" in args.only.split(","):
        extras_rows(models)


if __name__ == "__main__":
    main()
