"""Benchmark `dflash online` end to end against `dflash remote-eval` on the same checkpoint.

Over a loopback sshd eval host, the tiny Qwen3 target and the one-layer DFlash drafter of
`orchestrator.demo.vllm` (built and cached on first use), the models' own ground truth
(kind ``file``, 24 samples x 40 tokens), float32, one thread: ``dflash remote-eval``
(chain walk only) and ``dflash online`` (the same walk, plus vLLM started on the host's
loopback and every prompt through it), each timed from the command's start to its end.
Prints both times and their ratio, and the online job's fixed cost (the server's start-up,
from its verdict) against its per-token cost (its measurement), with the load average
beside them (this box is shared: ratios measured in the same run are what to compare).

    python benchmarks/online_job.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.demo.sshd import SSHServer, keygen, ssh_host_entry  # noqa: E402
from orchestrator.demo.vllm import vllm_models, vllm_python  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


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


def main() -> None:
    models = vllm_models()
    drafter = models.drafters["one-layer"][-1]
    with tempfile.TemporaryDirectory(prefix="dflash-online-") as tmp:
        base = Path(tmp)
        key = keygen(base / "id_test")
        (base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
        server = SSHServer.start(base, "evalhost", base / "authorized_keys")
        (base / "known_hosts").write_text(server.known_hosts_line())
        try:
            role = {
                "drafters": str(drafter.parent),
                "target_model": str(models.target),
                "ground_truth": str(models.ground_truth),
                "ground_truth_kind": "file",
                "dtype": "float32",
                "threads": 1,
                "serve": {"engine": "vllm", "python": str(vllm_python()), "kv_cache_gib": 1},
            }
            inv = base / "inventory.yaml"
            entry = ssh_host_entry(server, base, roles={"eval": role})
            inv.write_text(
                yaml.safe_dump(
                    {
                        "hosts": {"evalhost": entry},
                        "defaults": {"eval_host": "evalhost", "results_dir": str(base / "r")},
                    }
                )
            )
            common = ("-c", drafter.name, "-i", str(inv))
            print(f"load before: {load()}")
            # the first command pushes the bundle: a warm-up neither row pays for
            timed("remote-eval", *common, "--budgets", "", "--samples", "1")
            offline_s, _ = timed("remote-eval", *common, "--budgets", "")
            print(f"remote-eval (chain walk): {offline_s:.1f} s  (load {load()})")
            online_s, out = timed("online", *common)
            v = out["verdict"]
            srv = v["server"]
            per_token = srv["seconds"] / srv["tokens"]
            print(
                f"online: {online_s:.1f} s, verdict {v['verdict']}; server start-up "
                f"{srv['startup_s']:.1f} s, measurement {srv['seconds']:.2f} s for "
                f"{srv['tokens']} tokens = {1000 * per_token:.2f} ms/token  (load {load()})"
            )
            print(
                f"ratios: online / remote-eval {online_s / offline_s:.1f}x; start-up / "
                f"measurement {srv['startup_s'] / srv['seconds']:.1f}x; start-up / the whole "
                f"online run {srv['startup_s'] / online_s:.0%}"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
