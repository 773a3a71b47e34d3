"""A speedup estimate beside tau, from the round costs the eval host measured.

The eval host times one round's parts once per eval (`remote.eval.costs`, recorded as
``timings.round_costs``): a target decode step ``t_step`` (1 token over a KV cache), a
target verify ``t_verify(n)`` (n tokens over the same cache) and a drafter block
``t_draft``. Plain greedy decoding pays ``t_step`` per token; speculative decoding pays
``t_verify(n) + t_draft`` per round and gets tau tokens from it, so

    speedup = tau_tokens * t_step / (t_verify(n) + t_draft)

with tau_tokens the token-weighted tau (tokens / rounds: what a decoding's speed follows),
n = the drafter's block size for the chain and N + 1 for DDTree-N (the tree's nodes and its
root). What it leaves out: the per-round bookkeeping (sampling, cache crop, the drafter's
context update) and DDTree's tree building, so it is an upper bound that a lean serving
loop approaches; `benchmarks/speedup.py` measures how close on the reference loop.
"""

from __future__ import annotations

from typing import Any

# Reads a run (`store.Run`) through its ``result`` and ``metrics`` only: `store.summary`
# imports this module, so this one imports no store.


def costs(run: Any) -> dict[str, Any]:
    """The round costs the host recorded ({} when none, or when it could not measure)."""
    c = (run.result.get("timings") or {}).get("round_costs")
    return c if isinstance(c, dict) and not c.get("error") else {}


def formula(tau_tokens: float | None, step: Any, verify: Any, draft: Any) -> float | None:
    """``tau_tokens * step / (verify + draft)``; None when a part is missing or not > 0."""
    parts = (tau_tokens, step, verify, draft)
    if not all(isinstance(v, (int, float)) and v > 0 for v in parts):
        return None
    return tau_tokens * step / (verify + draft)


def estimate(run: Any) -> dict[str, Any]:
    """``{"chain": speedup, "ddtree": {budget: speedup}}`` of `run` (see the module), each
    None where its costs were not measured; {} when the run has no round costs."""
    c = costs(run)
    if not c:
        return {}
    verify = c.get("target_verify_s") or {}
    block = (run.result.get("inputs") or {}).get("block_size")
    m = run.metrics
    step, draft = c.get("target_step_s"), c.get("drafter_round_s")
    budgets = sorted(
        ((b, v) for b, v in (m.get("ddtree") or {}).items() if str(b).isdecimal()),
        key=lambda kv: int(kv[0]),
    )
    return {
        "chain": formula(m.get("tau_token_weighted"), step, verify.get(str(block)), draft),
        "ddtree": {
            str(b): formula(
                (v or {}).get("tau_token_weighted"), step, verify.get(str(int(b) + 1)), draft
            )
            for b, v in budgets
        },
    }
