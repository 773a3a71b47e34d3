"""Benchmark the ground-truth phase: requests in flight together against one at a time.

The server models a GPU serving engine (SGLang): requests arriving together are answered as
one batch, `--latency` seconds after the batch closes (a batched generation costs about what
one request's does). Both sides run the whole phase (`remote.eval.groundtruth.prepare`: tokenizer,
chat template, server identity, requests, checks, cache write) for `--prompts` prompts with a
fresh cache each time, in interleaved rounds. Prints the median times, the ratio serial /
concurrent (goal >= 5 for 40 prompts) and the load average beside them.

    python benchmarks/groundtruth.py [--prompts 40] [--latency 0.25] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrator.demo.models import build_qwen3_target  # noqa: E402
from orchestrator.demo.servers import BatchedReply, ScriptedServer, ids_reply  # noqa: E402
from remote.eval import groundtruth  # noqa: E402
from remote.protocol import GT_DEFAULT_CONCURRENCY  # noqa: E402


def answer(path: str, body: dict) -> dict:
    """A completion that depends on the prompt (so a mix-up would show in the records)."""
    prompt = body.get("input_ids") or body.get("prompt")
    return ids_reply([len(prompt) % 300, prompt[-1]] * 8)(path, body)


def phase(
    tmp: Path, target: str, prompts: Path, url: str, concurrency: int, run: int
) -> tuple[float, str]:
    spec = {
        "eval": {"target": target},  # the job's EvalSpec (remote.protocol.JOB_EVAL_KEY)
        "workdir": str(tmp / f"wd-{concurrency}-{run}"),
        "prompts": {"path": str(prompts)},
        "seed": 0,
        "sampling": {"temperature": 0, "max_new_tokens": 16},
        "ground_truth": {"kind": "sglang", "url": url, "concurrency": concurrency},
    }
    start = time.perf_counter()
    path, info = groundtruth.prepare(spec)
    took = time.perf_counter() - start
    assert info["cached"] is False
    return took, Path(path).read_text()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument(
        "--latency", type=float, default=0.25, help="seconds a batch takes on the modelled server"
    )
    ap.add_argument("--concurrency", type=int, default=GT_DEFAULT_CONCURRENCY)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        target = build_qwen3_target(str(tmp / "target"))
        prompts = tmp / "prompts.jsonl"
        prompts.write_text(
            "".join(
                json.dumps({"prompt": f"Question {i}: " + "why? " * (i % 7)}) + "\n"
                for i in range(args.prompts)
            )
        )
        reply = BatchedReply(answer, latency=args.latency)
        times: dict[int, list[float]] = {1: [], args.concurrency: []}
        with ScriptedServer(reply) as server:
            for run in range(args.rounds):
                outputs = {}
                for c in times:  # interleaved: serial, then concurrent, each round
                    took, outputs[c] = phase(tmp, target, prompts, server.url, c, run)
                    times[c].append(took)
                assert outputs[1] == outputs[args.concurrency], "records differ"
    serial = statistics.median(times[1])
    together = statistics.median(times[args.concurrency])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"ground truth, {args.prompts} prompts, server batch latency {args.latency:g}s, "
        f"{args.rounds} interleaved rounds, load avg {load}"
    )
    print(f"  serial (concurrency 1):        {serial:6.2f} s")
    print(
        f"  {'concurrency ' + str(args.concurrency) + ':':31}{together:6.2f} s  "
        f"(batches seen: {max(reply.batches)} requests at most)"
    )
    print(
        f"  serial / concurrent:           {serial / together:6.2f}x  (goal >= 5); "
        "records identical"
    )


if __name__ == "__main__":
    main()
