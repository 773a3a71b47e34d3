"""A speedup estimate beside tau from the host's round costs (docs/results.md, Speedup estimate)."""

from __future__ import annotations

from typing import Any

from remote.protocol.metrics import HEADLINE, find

# Reads a run through ``result`` and ``metrics`` only: `summary.summary` imports this module.

TAU, TOKENS = HEADLINE, "tau_token_weighted"
FORMULA = f"speedup = {TOKENS} * t_step / (t_verify + t_draft)"
SPREAD_LIMIT = 1.5  # slowest / fastest trial of one part beyond which no estimate is given
JITTER_S = 1e-3  # trials closer than this differ by the clock and scheduler, not by load

# every view of the trade-off table shows these, in `tradeoff_rows`' order
TRADEOFF_COLUMNS = (
    "budget (nodes)",
    "per-depth top-k",
    find(TAU).header,
    find(TOKENS).header,
    "rounds",
    "verify (ms)",
    "verify mask",
    "speedup est.",
)


def costs(run: Any) -> dict[str, Any]:
    """The round costs the host recorded ({} when none, or when it could not measure)."""
    c = (run.result.get("timings") or {}).get("round_costs")
    return c if isinstance(c, dict) and not c.get("error") else {}


def spans(run: Any) -> dict[str, tuple[float, float]]:
    """Each timed part's (fastest, slowest) trial; one trial gives its seconds twice."""
    out = {}
    for name, times in (costs(run).get("spread") or {}).items():
        if times and all(isinstance(t, (int, float)) and t > 0 for t in times):
            out[name] = (min(times), max(times))
    return out


def timed_once(run: Any) -> list[str]:
    """The parts the host timed once (a trial past its share of the budget): no spread."""
    spread, valid = costs(run).get("spread") or {}, spans(run)
    return sorted(name for name in valid if len(spread[name]) == 1)


def withheld(run: Any) -> str | None:
    """One line when a part's trials disagree by more than SPREAD_LIMIT (and JITTER_S),
    else None."""
    worst = [(hi / lo, name, lo, hi) for name, (lo, hi) in spans(run).items() if hi - lo > JITTER_S]
    if not worst or max(worst)[0] <= SPREAD_LIMIT:
        return None
    ratio, name, lo, hi = max(worst)
    return (
        f"withheld: the host's trials of {name} took {1e3 * lo:.1f}-{1e3 * hi:.1f} ms "
        f"({ratio:.1f}x apart, more than {SPREAD_LIMIT}x: a busy host); evaluate again on "
        "a quieter one"
    )


def _range(spread: dict, name: str, value: Any) -> tuple[Any, Any]:
    """(fastest, slowest) of part `name` (``target_verify_s/16``), or its value twice."""
    return spread.get(name, (value, value))


def estimate_range(run: Any) -> dict[str, Any]:
    """`estimate`'s (low, high) ends per walk from the trials' spread; {} without an estimate."""
    c, m, spread = costs(run), run.metrics, spans(run)
    if not c or withheld(run):
        return {}
    step = _range(spread, "target_step_s", c.get("target_step_s"))
    draft = _range(spread, "drafter_round_s", c.get("drafter_round_s"))

    def ends(tau, verify: tuple) -> tuple[Any, Any]:
        return (
            formula(tau, step[0], verify[1], draft[1]),
            formula(tau, step[1], verify[0], draft[0]),
        )

    block = (run.result.get("inputs") or {}).get("block_size")
    chain = _range(spread, f"target_verify_s/{block}", _chain_verify(run, c))
    trees = {}
    for b, v in _budgets(run):
        verify, mask = tree_verify(c, b)
        name = f"tree_verify_s/{b}" if mask == "tree" else f"target_verify_s/{b + 1}"
        trees[str(b)] = ends(v.get(TOKENS), _range(spread, name, verify))
    return {"chain": ends(m.get(TOKENS), chain), "ddtree": trees}


def formula(tau: float | None, step: Any, verify: Any, draft: Any) -> float | None:
    """``tau * step / (verify + draft)``; None when a part is missing or <= 0."""
    parts = (tau, step, verify, draft)
    if not all(isinstance(v, (int, float)) and v > 0 for v in parts):
        return None
    return tau * step / (verify + draft)


def tree_verify(c: dict, budget: int) -> tuple[float | None, str | None]:
    """DDTree-`budget`'s verify seconds and mask (tree, causal); (None, None)."""
    tree = (c.get("tree_verify_s") or {}).get(str(budget))
    if tree is not None:
        return tree, "tree"
    causal = (c.get("target_verify_s") or {}).get(str(budget + 1))
    return (causal, "causal") if causal is not None else (None, None)


def _chain_verify(run: Any, c: dict) -> Any:
    """The chain's verify seconds in the round costs `c`: a causal forward over its block."""
    block = (run.result.get("inputs") or {}).get("block_size")
    return (c.get("target_verify_s") or {}).get(str(block))


def _budgets(run: Any) -> list[tuple[int, dict]]:
    dd = run.metrics.get("ddtree") or {}
    return sorted(((int(b), v or {}) for b, v in dd.items() if str(b).isdecimal()))


def tradeoff(run: Any) -> dict[str, Any]:
    """DDTree's budget trade-off beside the chain (keys: docs/results.md); {} without budgets."""
    budgets = _budgets(run)
    if not budgets:
        return {}
    c, m = costs(run), run.metrics
    step, draft = c.get("target_step_s"), c.get("drafter_round_s")
    block = (run.result.get("inputs") or {}).get("block_size")
    chain_verify = _chain_verify(run, c)
    hold = withheld(run)
    at = None if hold else step
    rows = []
    for b, v in budgets:
        verify, mask = tree_verify(c, b)
        rows.append(
            {
                "budget": b,
                "topk": v.get("topk"),
                "tokens_verified": b + 1,
                TAU: v.get(TAU),
                TOKENS: v.get(TOKENS),
                "rounds": v.get("rounds"),
                "verify_s": verify,
                "verify_mask": mask,
                "speedup_estimate": formula(v.get(TOKENS), at, verify, draft),
            }
        )
    raw = (run.result.get("timings") or {}).get("round_costs")
    return {
        "formula": FORMULA,
        "target_step_s": step,
        "drafter_round_s": draft,
        "costs_error": raw.get("error") if isinstance(raw, dict) else None,
        "tree_verify_error": c.get("tree_verify_error"),
        "estimate_withheld": hold,
        "chain": {
            "block_size": block,
            "draft_tokens": block - 1 if isinstance(block, int) else None,
            "tokens_verified": block,
            TAU: m.get(TAU),
            TOKENS: m.get(TOKENS),
            "rounds": m.get("rounds"),
            "verify_s": chain_verify,
            "verify_mask": None if chain_verify is None else "causal",
            "speedup_estimate": formula(m.get(TOKENS), at, chain_verify, draft),
        },
        "budgets": rows,
    }


def tradeoff_rows(trade: dict[str, Any]) -> list[tuple]:
    """`tradeoff`'s table as raw values in TRADEOFF_COLUMNS' order, budgets then the chain."""
    keys = ("topk", TAU, TOKENS, "rounds", "verify_s", "verify_mask", "speedup_estimate")
    rows = [(r["budget"], *(r[k] for k in keys)) for r in trade["budgets"]]
    c = trade["chain"]
    drafts = "-" if c["draft_tokens"] is None else c["draft_tokens"]
    rows.append((f"chain ({drafts} drafts)", *(c.get(k) for k in keys)))
    return rows


def estimate(run: Any) -> dict[str, Any]:
    """Per walk speedup; {} without costs, ``{"withheld": line}`` if trials disagree."""
    c = costs(run)
    if not c:
        return {}
    if (why := withheld(run)) is not None:
        return {"withheld": why}
    m = run.metrics
    step, draft = c.get("target_step_s"), c.get("drafter_round_s")
    return {
        "chain": formula(m.get(TOKENS), step, _chain_verify(run, c), draft),
        "ddtree": {
            str(b): formula(v.get(TOKENS), step, tree_verify(c, b)[0], draft)
            for b, v in _budgets(run)
        },
    }


def cost_columns(run: Any) -> dict[str, Any]:
    """The round costs behind the estimates as flat columns in seconds; {} when the run has none."""
    c = costs(run)
    if not c:
        return {}
    out = {
        "target_step_s": c.get("target_step_s"),
        "drafter_round_s": c.get("drafter_round_s"),
        "verify_s_chain": _chain_verify(run, c),
    }
    for b, _v in _budgets(run):
        out[f"verify_s_ddtree_{b}"], out[f"verify_mask_ddtree_{b}"] = tree_verify(c, b)
    return out
