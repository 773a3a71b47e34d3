"""A loopback HTTP server that answers as vLLM 0.32 does for an online measurement
(`remote.online.vllm`), from a ground truth: ``POST /v1/completions`` (the prompt's greedy
completion, cut at ``max_tokens``, and ``metrics.speculative_decoding`` with per-step
arrays), ``GET /metrics`` (spec-decode counters and the decode-time histogram that grow
with every answer), ``GET /version`` and ``GET /health``. For what a real vLLM never
answers on demand: impossible counts, counters that do not move or go backwards, and a
server that stands in for vLLM in a job (`stand_in`: a "python" the job starts with
vLLM's command line).

``mode``: ``ok``; ``impossible`` (one verify step per output token, each accepting k
drafts: 15 steps of 3 for 16 tokens); ``frozen`` (the counters never move);
``backwards`` (they shrink between readings); ``negative`` (a counter below zero).
Without ``k`` (no drafter) the answers carry no acceptance, as a plain server's.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from orchestrator.demo.servers import Raw, ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
ACCEPT = (1, 2, 0, 3)  # the drafts each verify step accepts, in turn (capped at k)
DECODE_S_PER_TOKEN = 0.001


def steps_for(tokens: int, k: int, mode: str) -> list[int]:
    """Per verify step, the drafts accepted for an output of `tokens` tokens: steps until
    the output is complete (the last may run past it, as vLLM's does)."""
    if mode == "impossible":
        return [k] * (tokens - 1)
    out, emitted, i = [], 0, 0
    while emitted < tokens - 1:
        a = min(ACCEPT[i % len(ACCEPT)], k)
        out.append(a)
        emitted, i = emitted + a + 1, i + 1
    return out


class ScriptedVllm:
    """The server (see the module docstring) for `rows` (ground-truth records), drafting
    `k` tokens a step (None: no drafter); ``url`` once constructed, ``close`` to stop."""

    def __init__(self, rows: list[dict], k: int | None = 3, mode: str = "ok", port: int = 0):
        self.truth = {tuple(r["prompt_ids"]): r["completion_ids"] for r in rows}
        self.k, self.mode = k, mode
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.per_pos = [0] * (k or 0)
        self.requests, self.decode_s, self.readings = 0, 0.0, 0
        self._lock = threading.Lock()
        self.server = ScriptedServer(self._reply, model_path="/m", get_reply=self._get, port=port)
        self.url = self.server.url

    def _reply(self, path: str, body: dict) -> dict:
        ids = self.truth[tuple(body["prompt"])][: body["max_tokens"]]
        answer = {
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "finish_reason": "length",
                    "token_ids": ids,
                    "prompt_token_ids": body["prompt"],
                }
            ]
        }
        spec = None
        if self.k is not None:
            acc = steps_for(len(ids), self.k, self.mode)
            hist = [acc.count(j) for j in range(self.k + 1)]
            spec = {
                "acceptance_histogram": hist,
                "num_spec_steps": len(acc),
                "num_accepted_draft_tokens": sum(acc),
                "num_draft_tokens": self.k * len(acc),
                "num_spec_tokens": self.k,
                "mean_acceptance_length": 1 + sum(acc) / len(acc) if acc else 1.0,
                "per_step_accepted": acc,
                "per_step_drafted": [self.k] * len(acc),
            }
        with self._lock:
            self.requests += 1
            self.decode_s += DECODE_S_PER_TOKEN * max(len(ids) - 1, 0)
            if spec is not None and self.mode != "frozen":
                self.counts["drafts"] += spec["num_spec_steps"]
                self.counts["draft_tokens"] += spec["num_draft_tokens"]
                self.counts["accepted"] += spec["num_accepted_draft_tokens"]
                for j in range(self.k):
                    self.per_pos[j] += sum(a > j for a in spec["per_step_accepted"])
        answer["metrics"] = {"speculative_decoding": spec}
        return answer

    def _get(self, path: str):
        if path == "/metrics":
            return Raw(self.metrics().encode(), headers={"Content-Type": "text/plain"})
        if path == "/version":
            return {"version": "0.32.0"}
        if path == "/health":
            return Raw(b"")
        return None

    def metrics(self) -> str:
        """The /metrics page now (`mode` decides how its counters behave)."""
        with self._lock:
            self.readings += 1
            drafts, draft_tokens, accepted = self.counts.values()
            pos = list(self.per_pos)
            if self.mode == "backwards":  # consistent counts, each reading lower
                drafts = accepted = 1000 - 7 * self.readings
                draft_tokens, pos = 3 * drafts, [drafts] + [0] * (len(pos) - 1)
            if self.mode == "negative":
                drafts = -5
            labels = 'engine="0",model_name="/m"'
            name = "vllm:spec_decode_num_"
            lines = [
                f"{name}drafts_total{{{labels}}} {drafts}.0",
                f"{name}draft_tokens_total{{{labels}}} {draft_tokens}.0",
                f"{name}accepted_tokens_total{{{labels}}} {accepted}.0",
            ]
            lines += [
                f'{name}accepted_tokens_per_pos_total{{{labels},position="{j}"}} {v}.0'
                for j, v in enumerate(pos)
            ]
            lines += [
                f"vllm:request_decode_time_seconds_count{{{labels}}} {self.requests}.0",
                f"vllm:request_decode_time_seconds_sum{{{labels}}} {self.decode_s}",
            ]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> ScriptedVllm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


STAND_IN = """\
#!{python}
# Stands in for vLLM's python in an online job: started with vLLM's command line, it says
# its OpenMP threads and where it runs (as vLLM's log does), then answers as vLLM would.
import sys
sys.path.insert(0, {root!r})
from tests.helpers.scripted_vllm import serve_as_vllm
serve_as_vllm(sys.argv, {ground_truth!r}, {mode!r})
"""


def stand_in(path: Path, ground_truth: Path, mode: str = "ok") -> Path:
    """An executable at `path` a job can start as its serving engine's python; `ground_truth`
    a file, or a folder whose every ``*.jsonl`` it reads when started (a host's cache)."""
    path.write_text(
        STAND_IN.format(
            python=sys.executable, root=str(ROOT), ground_truth=str(ground_truth), mode=mode
        )
    )
    path.chmod(0o755)
    return path


def serve_as_vllm(argv: list[str], ground_truth: str, mode: str) -> None:
    """The stand-in's body: vLLM's ``--port`` and ``--speculative-config`` read from
    `argv`, its environment's threads printed, then served on that port until killed."""
    import os
    import time

    port = int(argv[argv.index("--port") + 1])
    k = None
    if "--speculative-config" in argv:
        k = json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    print("(EngineCore) INFO [cpu_worker.py:260] scripted stand-in for vLLM", flush=True)
    print(f"argv: {json.dumps(argv[1:])}", flush=True)
    path = Path(ground_truth)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    rows = [json.loads(ln) for f in files for ln in f.read_text().splitlines() if ln]
    ScriptedVllm(rows, k, mode, port=port)
    while True:
        time.sleep(3600)
