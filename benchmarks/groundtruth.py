"""How much faster is the ground-truth phase with requests in flight together than one at a time?

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
import tempfile
import time
from pathlib import Path

from common.measure import goal, interleave, load_avg

from orchestrator.demo.models import build_qwen3_target
from orchestrator.demo.servers import BatchedReply, ScriptedServer, ids_reply
from remote.eval import groundtruth
from remote.protocol import GT_DEFAULT_CONCURRENCY


def answer(path: str, body: dict) -> dict:
    """A completion that depends on the prompt (so a mix-up would show in the records)."""
    prompt = body.get("input_ids") or body.get("prompt")
    return ids_reply([len(prompt) % 300, prompt[-1]] * 8)(path, body)


def phase(tmp: Path, target: str, prompts: Path, url: str, concurrency: int) -> tuple[float, str]:
    """(seconds, records) of the whole phase with ``concurrency`` requests in flight, on a
    fresh cache."""
    spec = {
        "eval": {"target": target},  # the job's EvalSpec (remote.protocol.JOB_EVAL_KEY)
        "workdir": tempfile.mkdtemp(prefix=f"wd-{concurrency}-", dir=tmp),
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
        outputs: dict[int, str] = {}

        def run(c: int) -> dict:
            took, outputs[c] = phase(tmp, target, prompts, server.url, c)
            return {"wall": took}

        with ScriptedServer(reply) as server:
            ways = {"serial": lambda: run(1), "together": lambda: run(args.concurrency)}
            got = interleave(ways, args.rounds)
        assert outputs[1] == outputs[args.concurrency], "records differ"
    serial, together = got.median("serial"), got.median("together")
    print(
        f"ground truth, {args.prompts} prompts, server batch latency {args.latency:g}s, "
        f"{args.rounds} interleaved rounds, load avg {load_avg()}"
    )
    print(f"  serial (concurrency 1):        {serial:6.2f} s")
    print(
        f"  {'concurrency ' + str(args.concurrency) + ':':31}{together:6.2f} s  "
        f"(batches seen: {max(reply.batches)} requests at most)"
    )
    goal("  serial / concurrent", serial / together, ">=", 5, "records identical")


if __name__ == "__main__":
    main()
