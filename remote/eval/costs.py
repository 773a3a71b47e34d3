"""What one round of speculative decoding costs on this host, measured once per eval.

The walk measures acceptance, not speed: its target pass is one teacher-forced forward
over a whole sequence and its drafter batches every position. A serving engine's round is
different: one target forward over the block being verified, on top of a KV cache of the
context, and one drafter call for the next block. `round_costs` times exactly those, on
one sample's context (its prompt and completion: the KV cache the walk's forward over it
left, `remote.eval.round_timing.Capture`), with the target and drafter the eval just
used, on the eval's device:

- ``target_step_s``: one target forward of 1 token (an autoregressive decode step);
- ``target_verify_s``: one target forward of n tokens (causal), for n = the block size
  (the chain) and each DDTree budget + 1, keyed by n;
- ``tree_verify_s``: per DDTree budget N, one target forward over the tree's N + 1 tokens
  (its root, the last accepted token, and N drafted nodes) with a tree attention mask
  (each node sees the context, its ancestors and itself) and each node at position
  context + its depth: the tree the drafter's own block at that context gives
  (`remote.eval.ddtree.build_tree`, per-depth top-k as the walk's). Keyed by N. Where the
  target cannot run a tree mask (linear-attention layers take no attention mask), one
  line in ``tree_verify_error`` and the estimate falls back to ``target_verify_s[N+1]``;
- ``drafter_round_s``: one drafter block (its forward and its head over the block).

Each is the fastest of up to `REPEATS` after one untimed warm-up, each trial on its own
copy of the context's KV cache (copied untimed), so no cache is ever cropped: targets
whose cache cannot be cropped back (recurrent state, sliding windows) are timed as any
other. Within the eval's budget (`remote.eval.round_timing`: a share of the walk's
seconds) a part whose trials cost seconds gets two, and a verify size or a tree the
budget leaves no room for is read off the timed sizes (no tree: the estimate then takes
the causal verify); ``spread`` keeps each timed part's fastest and slowest trial. The
controller turns them and the run's tau into a speedup estimate with its spread
(docs/results.md). Any failure is recorded as ``error`` and the eval goes on: the numbers
are an estimate beside tau, never a reason to lose it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from remote.eval.ddtree import build_tree
from remote.eval.metrics import ddtree_k
from remote.eval.round_timing import REPEATS, Trials, interpolate
from remote.eval.target import cache_kwarg
from remote.protocol import TARGET_COSTS, ResultError
from remote.protocol.results import check_doc
from remote.protocol.values import finite


def _error(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def tree_inputs(
    nodes: list[tuple[int, int, int]], root: int, base: int
) -> tuple[list[int], list[int], torch.Tensor]:
    """The verify forward of a DDTree (`build_tree`'s nodes below the root token `root`,
    over a cache of `base` tokens): its tokens, their positions (`base` + depth) and which
    tree token may look at which ([N+1, N+1] booleans: its ancestors and itself)."""
    n = len(nodes) + 1
    tokens = [root] + [tok for _p, _d, tok in nodes]
    positions = [base] + [base + d for _p, d, _t in nodes]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[0, 0] = True
    for i, (parent, _d, _t) in enumerate(nodes, 1):
        allowed[i] = allowed[parent + 1]  # the root is row 0, node k is row k + 1
        allowed[i, i] = True
    return tokens, positions, allowed


def additive_mask(
    allowed: torch.Tensor,
    positions: list[int],
    kept: int,
    window: int | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """[1, 1, N+1, kept+N+1] additive mask (0: may look; the dtype's minimum: may not) of
    tree tokens at `positions` over the last `kept` context tokens (positions ``base -
    kept .. base - 1``) and the tree (`allowed`); a sliding `window` also hides every key
    ``window`` or more positions back, as transformers' sliding layers do."""
    base = positions[0]
    keys = torch.tensor(list(range(base - kept, base)) + positions)
    see = torch.cat([torch.ones(len(positions), kept, dtype=torch.bool), allowed], dim=1)
    if window is not None:
        see &= torch.tensor(positions)[:, None] - keys[None, :] < window
    mask = torch.where(see, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask[None, None]


def tree_mask(target, cache, allowed, positions, dtype):
    """The tree's attention mask as the target's backbone takes it: one 4D mask, or, for a
    target with sliding-window layers, one per layer type (a sliding layer's cache keeps
    only its window). Linear-attention layers take no mask (transformers gives them none
    for a 4D one): they run the tree's tokens as a sequence, the same work as a tree-aware
    kernel's. Another layer type is an error (the estimate then uses a causal verify)."""
    base = positions[0]
    cfg = target.model.config.get_text_config()
    types = list(getattr(cfg, "layer_types", None) or [])
    full = additive_mask(allowed, positions, base, None, dtype)
    if set(types) <= {"full_attention", "linear_attention"}:
        return full
    out = {}
    for kind in dict.fromkeys(types):
        if kind in ("full_attention", "linear_attention"):
            out[kind] = full if kind == "full_attention" else None
        elif kind == "sliding_attention":
            kept = cache.layers[types.index(kind)].keys.shape[-2]
            out[kind] = additive_mask(allowed, positions, kept, cfg.sliding_window, dtype)
        else:
            raise ValueError(f"no tree mask for the target's {kind} layers")
    return out


@torch.inference_mode()
def round_costs(
    target,
    drafter,
    ids: list[int],
    sizes: list[int],
    device: torch.device,
    budgets: list[int] = (),
    topk: int | None = None,
    cached: dict | None = None,
    context_features: torch.Tensor | None = None,
    walked: dict | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Seconds of a target step, a target verify of each of `sizes` tokens, a tree verify
    of each DDTree budget and a drafter block, over a KV cache of `ids[:-max(sizes)]`
    (see the module). `cached`: the target's part (`remote.protocol.TARGET_COSTS`) an
    earlier eval on this host measured on the same inputs; only the drafter is timed then,
    over `context_features` (the context's target features) when the target was loaded
    without its layers. `walked`: the walk's cache, features and seconds over that context
    (`remote.eval.round_timing.Capture`), reused; `budget_s`: the seconds the timing may
    take (`round_timing.Trials`; None: every part, every trial)."""
    longest = max(sizes)
    context, tail = ids[:-longest], ids[-longest:]
    base = len(context)
    if walked is not None:
        context_features = walked["features"]
    if context_features is None:
        context_features, _ = target.hidden(context, drafter.cfg.target_layer_ids)
    kv = drafter.context_kv(context_features.to(drafter.fc.weight.dtype))
    first = torch.tensor([tail[0]], device=device)
    trials = Trials(device, budget_s)
    got: dict[str, Any] = {}

    def draft() -> None:
        block_in = drafter.block_inputs(target.embed, first)
        h = drafter.forward_blocks(kv, torch.tensor([base], device=device), block_in)[0]
        got["logits"] = drafter.logits(h[1:], target.lm_head)
        got["logits"].argmax(-1).tolist()

    best = trials.best("drafter_round_s", draft)
    if cached is not None:
        spread = {**cached.get("spread", {}), "drafter_round_s": trials.spread["drafter_round_s"]}
        return {**cached, "drafter_round_s": best, "target_costs": "cached", "spread": spread}
    out = time_target(target, got["logits"], context, tail, sizes, trials, budgets, topk, walked)
    out["spread"] = {k: v for k, v in trials.spread.items() if k != "drafter_round_s"}
    spread = {**out["spread"], "drafter_round_s": trials.spread["drafter_round_s"]}
    return {**out, "drafter_round_s": best, "target_costs": "measured", "spread": spread}


def time_target(
    target, logits, context, tail, sizes, trials, budgets, topk, walked=None
) -> dict[str, Any]:
    """The target's part of `round_costs`: a step, a verify of each of `sizes` tokens of
    `tail` and each budget's tree (built from the drafter block's `logits`), over a KV
    cache of `context` (the walk's, in `walked`, or made here), timed by `trials`. The
    step and the chain's verify are always timed; another size or a tree only while the
    budget allows, a size left out read off the timed ones (`round_timing.interpolate`)."""
    from transformers import DynamicCache

    device = trials.device
    backbone, key = target.backbone, cache_kwarg(target.backbone)
    if walked is not None:
        cache = walked["cache"]
    else:
        cache = DynamicCache(config=target.model.config)
        ctx = torch.tensor([context], device=device)
        backbone(input_ids=ctx, **{key: cache}, use_cache=True)
    base = len(context)
    trial: dict[str, Any] = {}

    def target_forward(name: str, tokens: list[int], **extra) -> float:
        block = torch.tensor([tokens], device=device)

        def fresh() -> None:  # a fresh context each time: nothing to crop (untimed)
            trial["cache"] = copy.deepcopy(cache)

        def run() -> None:
            out = backbone(input_ids=block, **{key: trial.pop("cache")}, use_cache=True, **extra)
            target.head(out.last_hidden_state[0]).argmax(-1).tolist()

        return trials.best(name, run, fresh)

    step = target_forward("target_step_s", tail[:1])
    chain, *others = sorted(set(sizes), key=lambda n: (n != sizes[0], n))
    points = {1: step, chain: target_forward(f"target_verify_s/{chain}", tail[:chain])}
    if walked is not None and walked.get("forward_s"):  # the walk's forward: all of them
        points.setdefault(base, walked["forward_s"])
    verify = {str(chain): points[chain]}
    for n in others:
        guess = interpolate(points, n)
        if trials.fits(guess):
            verify[str(n)] = points[n] = target_forward(f"target_verify_s/{n}", tail[:n])
        else:
            verify[str(n)] = guess
    out = {
        "context_tokens": base,
        "target_step_s": step,
        "target_verify_s": verify,
        "repeats": REPEATS,
    }
    if budgets:
        try:
            out["tree_verify_s"] = _tree_costs(
                target_forward,
                trials,
                points,
                target,
                cache,
                logits,
                tail[0],
                base,
                budgets,
                topk,
            )
        except Exception as exc:  # the chain's costs stand; the estimate says which it used
            out["tree_verify_error"] = _error(exc)
    return out


def _tree_costs(
    forward, trials, points, target, cache, logits, root, base, budgets, topk
) -> dict[str, float]:
    """`forward`'s seconds over each budget's tree, built from the drafter's block
    `logits` [depths, vocab] with the walk's per-depth top-k (`ddtree_k`), its mask
    (`tree_mask`) in the target's dtype over the context's `cache`; the trees the budget
    of `trials` leaves no room for are left out (the estimate then reads the causal
    verify of as many tokens)."""
    dtype, device = target.dtype, trials.device
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = {}
    for n in sorted(set(budgets)):
        if not trials.fits(interpolate(points, n + 1)):
            continue
        k = ddtree_k(n, topk, logp.shape[-1])
        top = logp.topk(k, dim=-1)
        nodes = build_tree(top.values.tolist(), top.indices.tolist(), n)
        tokens, positions, allowed = tree_inputs(nodes, root, base)
        mask = tree_mask(target, cache, allowed, positions, dtype)
        moved = (
            {k: None if v is None else v.to(device) for k, v in mask.items()}
            if isinstance(mask, dict)
            else mask.to(device)
        )
        out[str(n)] = forward(
            f"tree_verify_s/{n}",
            tokens,
            attention_mask=moved,
            position_ids=torch.tensor([positions], device=device),
        )
    return out


@dataclass(frozen=True)
class CostInputs:
    """What `measure` times on: the sample of median length (`row`), the whole of it and
    then its own last tokens again (`ids`: a round's context, its prompt and completion,
    which the walk's forward over it leaves cached, and the tokens a round verifies), the
    verify sizes (the drafter's block and each DDTree budget + 1)."""

    row: dict
    ids: list[int]
    sizes: list[int]
    budgets: list[int]
    topk: int | None

    @classmethod
    def of(
        cls, rows: list[dict], block_size: int, budgets: list[int], topk: int | None
    ) -> CostInputs:
        row = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["completion_ids"]))[
            len(rows) // 2
        ]
        sizes = [block_size, *[b + 1 for b in budgets]]
        context = list(row["prompt_ids"]) + list(row["completion_ids"])
        tail = (context * (max(sizes) // len(context) + 1))[-max(sizes) :]
        return cls(row, context + tail, sizes, list(budgets), topk)

    @property
    def context(self) -> list[int]:
        """The round's context: the sample, prompt and completion."""
        return self.ids[: -max(self.sizes)]

    def key(self) -> dict:
        """What the target's costs depend on beyond the host and the target (a feature
        cache's context): the tokens and the sizes, the budgets and their top-k."""
        digest = hashlib.sha256(json.dumps(self.ids).encode()).hexdigest()
        return {
            "ids_sha256": digest,
            "tokens": len(self.ids),
            "sizes": self.sizes,
            "budgets": self.budgets,
            "topk": self.topk,
            "repeats": REPEATS,
        }


def valid_target_costs(doc: Any) -> dict | None:
    """`doc` when it is the target's part of a round's costs (`remote.protocol.TARGET_COSTS`)
    with a step and a verify, every second a positive finite number; else None."""
    try:
        check_doc(doc, TARGET_COSTS)
    except ResultError:
        return None
    if not isinstance(doc, dict) or not doc.get("target_verify_s"):
        return None
    seconds = [doc.get("target_step_s"), *doc["target_verify_s"].values()]
    seconds += list((doc.get("tree_verify_s") or {}).values())
    if not all(finite(v) and v > 0 for v in seconds):
        return None
    return {k: doc[k] for k in TARGET_COSTS if k in doc}


def measure(
    target,
    drafter,
    inputs: CostInputs,
    device: torch.device,
    cached: dict | None = None,
    context_features: torch.Tensor | None = None,
    walked: dict | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """`round_costs` on `inputs` (`CostInputs.of` the eval's rows), for the drafter's
    block and each DDTree budget (per-depth top-k as the walk's); `cached`,
    `context_features`, `walked`, `budget_s`: as `round_costs` takes them. A failure is
    ``{"error": one line}``, never the eval's."""
    try:
        return round_costs(
            target,
            drafter,
            inputs.ids,
            inputs.sizes,
            device,
            inputs.budgets,
            inputs.topk,
            cached=cached,
            context_features=context_features,
            walked=walked,
            budget_s=budget_s,
        )
    except Exception as exc:  # an estimate beside tau: never the eval's failure
        return {"error": _error(exc)}
