"""An online job's ``verdict.json`` put together from what it measured: levels, server,
engine costs and the baseline's speedup (pure)."""

from __future__ import annotations

import time
from typing import Any

from remote.online import verdict


def build(
    rows: list[dict],
    offline: list[dict],
    measured: dict[str, Any],
    baseline: dict[str, Any] | None,
    *,
    block_size: int,
    offline_dtype: str | None = None,
    online_dtype: str | None = None,
) -> dict[str, Any]:
    """The verdict of `measured` (and `baseline`) levels on the ground-truth `rows`;
    `offline`: the walk's ``samples.jsonl`` records."""

    def cut(m: dict, invalid: list[dict]) -> dict:
        return verdict.compare(
            rows,
            offline,
            m["samples"],
            block_size=block_size,
            offline_dtype=offline_dtype,
            online_dtype=online_dtype,
            invalid=invalid,
        )

    levels = measured["levels"]
    first = levels[0]
    invalid = list(first.get("invalid") or []) + [
        {**bad, "detail": f"at concurrency {m['concurrency']}: {bad['detail']}"}
        for m in levels[1:]
        for bad in m.get("invalid") or []
    ]
    result = cut(first, invalid)
    result["levels"] = [verdict.level(first["concurrency"], first, result, None)] + [
        verdict.level(m["concurrency"], m, cut(m, m.get("invalid") or []), result)
        for m in levels[1:]
    ]
    result["server"] = {
        **measured["server"],
        "seconds": first["seconds"],
        "tokens": first["tokens"],
        "counters": first.get("counters"),
        "counters_expected": first.get("counters_expected"),
        "counters_agree": first.get("counters_agree"),
    }
    result["engine_costs"] = verdict.engine_costs(first.get("decode"), rows, first.get("counters"))
    if baseline is not None:
        result["baseline"] = _baseline(rows, baseline, result)
    # less the ids: `per_sample` says whether they matched
    result["online_samples"] = [
        {k: v for k, v in r.items() if k != "token_ids"} for r in first["samples"]
    ]
    result["created"] = time.time()
    return verdict.conclude(result)


def _baseline(rows: list[dict], baseline: dict, result: dict) -> dict[str, Any]:
    """The baseline's levels, each level's speedup set in `result`, and its ``t_step``."""
    truth = {r["id"]: r["completion_ids"] for r in rows}
    out_levels = []
    for m, lv in zip(baseline["levels"], result["levels"], strict=True):
        seconds, tokens = m["seconds"], m["tokens"]
        tps = tokens / seconds if seconds > 0 else None
        lossless = sum(s["token_ids"] == truth[s["id"]] for s in m["samples"])
        out_levels.append(
            {
                "concurrency": m["concurrency"],
                "seconds": seconds,
                "tokens": tokens,
                "tokens_per_s": tps,
                "lossless": lossless,
            }
        )
        lv["baseline_tokens_per_s"] = tps
        lv["speedup"] = lv["tokens_per_s"] / tps if tps and lv["tokens_per_s"] else None
    plain_first = baseline["levels"][0]
    costs = None
    if not plain_first.get("invalid"):
        costs = verdict.engine_costs(plain_first.get("decode"), rows, None)
    spec_costs = result.get("engine_costs") or {}
    plain = (costs or {}).get("time_per_output_token_s")
    spec = spec_costs.get("time_per_output_token_s")
    return {
        "started_here": baseline["started_here"],
        "url": baseline["url"],
        "startup_s": baseline["startup_s"],
        "levels": out_levels,
        "engine_costs": costs,
        "decode_speedup": plain / spec if plain and spec else None,
    }
