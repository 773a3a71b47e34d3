"""Sharding's pure parts: samples per host by expected tokens, and the merged result."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from remote.eval.metrics import expected, summarize
from remote.protocol import GT_DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS

MUST_AGREE = (
    "dtype",
    "positions",
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "ddtree",
    "target_vocab_size",
    "target_architecture",
    "drafter_parameters",
    "target_layers",
)


@dataclass
class Shard:
    """The samples (indices into the ground truth, ascending) one host evaluates."""

    host: str
    indices: list[int] = field(default_factory=list)
    tokens: int = 0

    def to_json(self, records: list[dict]) -> dict:
        return {
            "host": self.host,
            "samples": [records[i]["id"] for i in self.indices],
            "expected_tokens": self.tokens,
        }


def expected_tokens(record: dict, max_new_tokens: int) -> int:
    """What one sample costs: prompt + completion (or `max_new_tokens`, its most) tokens."""
    completion = record.get("completion_ids")
    tail = len(completion) if completion is not None else max_new_tokens
    return len(record["prompt_ids"]) + tail


def plan_shards(
    records: list[dict],
    hosts: list[str],
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    indices: list[int] | None = None,
) -> list[Shard]:
    """Split `indices` (default all) across `hosts`: longest first onto the least-loaded
    host; deterministic, one shard per host (maybe empty) in `hosts` order."""
    if not hosts:
        raise DflashError("no eval hosts to shard across")
    todo = list(range(len(records))) if indices is None else list(indices)
    shards = [Shard(h) for h in hosts]
    cost = {i: expected_tokens(records[i], max_new_tokens) for i in todo}
    for i in sorted(todo, key=lambda i: (-cost[i], i)):
        least = min(shards, key=lambda s: s.tokens)  # min keeps the first of equals
        least.indices.append(i)
        least.tokens += cost[i]
    for s in shards:
        s.indices.sort()
    return shards


def merged_features(shard_results: list[dict]) -> dict | None:
    """The shards' ``inputs.target_features`` as one run's (``cached`` only if all were)."""
    parts = [(r.get("inputs") or {}).get("target_features") for r in shard_results]
    said = [p for p in parts if isinstance(p, dict)]
    if not said:
        return None
    return {
        "cached": len(said) == len(parts) and all(p.get("cached") for p in said),
        "cache": "on" if any(p.get("cache") == "on" for p in said) else "off",
        **{k: sum(p.get(k) or 0 for p in said) for k in ("samples_cached", "samples_stored")},
    }


def merge_result(
    shard_results: list[dict],
    records: list[dict],
    *,
    ground_truth_source: dict,
    shards: dict,
    job: dict,
    wall_s: float,
) -> dict:
    """One ``dflash.eval/1`` result from the shards' results (agreeing on `MUST_AGREE`) and
    every record in ground-truth order, the metrics recomputed."""
    if not shard_results:
        raise DflashError("no shard finished; nothing to merge")
    base = shard_results[0]
    inputs = base.get("inputs") or {}
    for other in shard_results[1:]:
        theirs = other.get("inputs") or {}
        for key in MUST_AGREE:
            if theirs.get(key) != inputs.get(key):
                raise DflashError(
                    f"shards disagree on {key} ({inputs.get(key)!r} vs "
                    f"{theirs.get(key)!r}): the hosts do not hold the same "
                    "target/drafter; results cannot be merged"
                )
    vocab = inputs.get("target_vocab_size")
    if vocab is None:
        raise DflashError(
            "a shard's result lacks target_vocab_size: its host ran an older "
            "eval engine; rerun with the current bundle"
        )
    ddtree = inputs.get("ddtree") or {}
    metrics = summarize(
        records, inputs["block_size"], ddtree.get("budgets") or [], ddtree.get("topk"), vocab
    )
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in records)
    timings = [r.get("timings") or {} for r in shard_results]
    result = copy.deepcopy(base)
    result["inputs"].update(
        samples=len(records),
        max_samples=None,
        ground_truth=None,
        ground_truth_source=ground_truth_source,
        # the whole ground truth's (a shard's is its slice's): runs over it then pair
        ground_truth_sha256=ground_truth_source.get("sha256"),
        target_features=merged_features(shard_results),
    )
    result["metrics"] = metrics
    if isinstance(base.get("expected"), dict):  # T > 0: every shard's samples, not one's
        was = base["expected"]
        result["expected"] = expected(records, was, was.get("method", "dp"))
    result["timings"] = {
        "load_target_s": max(t.get("load_target_s") or 0.0 for t in timings),
        "load_drafter_s": max(t.get("load_drafter_s") or 0.0 for t in timings),
        "eval_s": wall_s,
        "target_forward_s": sum(r["seconds"]["target"] for r in records),
        "drafter_s": sum(r["seconds"]["drafter"] for r in records),
        "ddtree_s": sum(r["seconds"]["ddtree"] for r in records),
        "total_s": wall_s,
        "tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "note": "eval_s/total_s: wall time of the sharded run, ground truth included",
    }
    result["job"] = job
    result["shards"] = shards
    result["reassigned"] = shards.get("reassigned", [])
    return result
