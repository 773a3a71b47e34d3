"""SGLang's acceptance per request from its native ``POST /generate``; checked against its
documented fields only, no real server yet (docs/online.md, "--server URL")."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from remote.errors import UserError
from remote.httpclient import answer_bytes, http_json
from remote.online.vllm import ROLE, _int_list
from remote.protocol.values import finite, is_int


def generate_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/generate") else url + "/generate"


def parse_generate(answer: Any, where: str, max_tokens: int, vocab: int) -> dict[str, Any]:
    """One ``/generate`` answer, validated: the output ids, the spec fields' types and
    agreement."""
    if not isinstance(answer, dict):
        raise UserError(f"{where} answered {type(answer).__name__}, not a JSON object")
    ids = answer.get("output_ids")
    if not _int_list(ids) or len(ids) != max_tokens:
        raise UserError(
            f"{where} output_ids is not {max_tokens} token ids (max_new_tokens with ignore_eos)"
        )
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise UserError(f"{where} output_ids holds {bad}, outside the target's vocabulary")
    meta = answer.get("meta_info")
    if not isinstance(meta, dict):
        raise UserError(f"{where} answered without a meta_info object")
    steps, length = meta.get("spec_verify_ct"), meta.get("spec_accept_length")
    if not is_int(steps) or not 0 <= steps <= max_tokens:
        raise UserError(
            f"{where} meta_info.spec_verify_ct is {steps!r}, not a count of verify steps "
            f"(0..{max_tokens}); is speculative decoding on?"
        )
    if not finite(length) or (steps and not 1 <= length <= max_tokens + 1):
        raise UserError(f"{where} meta_info.spec_accept_length is {length!r}, not 1..{max_tokens}")
    hist = meta.get("spec_accept_histogram")
    if hist is not None and (not _int_list(hist) or min(hist, default=0) < 0 or sum(hist) != steps):
        raise UserError(
            f"{where} meta_info.spec_accept_histogram is {hist!r}, not counts adding up to "
            f"its {steps} verify steps"
        )
    return {
        "token_ids": list(ids),
        "num_spec_steps": steps,
        "mean_acceptance_length": float(length) if steps else None,
        "acceptance_histogram": None if hist is None else list(hist),
    }


def measure(
    url: str,
    rows: list[dict],
    vocab: int,
    *,
    model: str | None = None,
    timeout: float = 300.0,
    concurrency: int = 1,
    on_done: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Each ground-truth prompt through ``/generate``, `concurrency` in flight; records
    as `remote.online.vllm.measure` returns them, without per-step arrays."""
    where = generate_url(url)
    del model  # SGLang serves one model per server

    def one(row: dict) -> dict[str, Any]:
        n = len(row["completion_ids"])
        payload = {
            "input_ids": row["prompt_ids"],
            "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
        }
        bound = answer_bytes(len(row["prompt_ids"]), n)
        answer = http_json(where, payload, timeout, max_bytes=bound, role=ROLE)
        return {
            "id": row["id"],
            **parse_generate(answer, where, n, vocab),
            # its histogram's length is not documented to be k + 1: k stays unknown
            "num_spec_tokens": None,
            "per_step_accepted": None,
            "per_step_drafted": None,
            "finish_reason": None,
        }

    t0 = time.perf_counter()
    samples: list[dict] = []
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="online") as pool:
        for got in pool.map(one, rows):
            samples.append(got)
            if on_done:
                on_done(len(samples), len(rows))
    return {
        "samples": samples,
        "counters": None,
        "counters_expected": None,
        "counters_agree": None,
        "seconds": time.perf_counter() - t0,
        "tokens": sum(len(s["token_ids"]) for s in samples),
        "decode": None,  # no documented per-request timing
        "invalid": [],
    }
