"""What one serving round costs on this host (docs/results.md, Speedup estimate)."""

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
    """A DDTree verify's tokens, positions and visibility over `base` tokens."""
    n = len(nodes) + 1
    tokens = [root] + [tok for _p, _d, tok in nodes]
    positions = [base] + [base + d for _p, d, _t in nodes]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[0, 0] = True
    for i, (parent, _d, _t) in enumerate(nodes, 1):
        allowed[i] = allowed[parent + 1]
        allowed[i, i] = True
    return tokens, positions, allowed


def additive_mask(
    allowed: torch.Tensor,
    positions: list[int],
    kept: int,
    window: int | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Additive mask of tree tokens over `kept` context tokens and the tree."""
    base = positions[0]
    keys = torch.tensor(list(range(base - kept, base)) + positions)
    see = torch.cat([torch.ones(len(positions), kept, dtype=torch.bool), allowed], dim=1)
    if window is not None:
        see &= torch.tensor(positions)[:, None] - keys[None, :] < window
    mask = torch.where(see, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask[None, None]


def tree_mask(target, cache, allowed, positions, dtype):
    """The tree's mask as the backbone takes it (4D, or per layer type)."""
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
    """Seconds of a step, verifies, tree verifies and a drafter block on a cached context."""
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
    """The target's part of `round_costs`, untimed parts interpolated."""
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

        def fresh() -> None:
            trial["cache"] = copy.deepcopy(cache)

        def run() -> None:
            out = backbone(input_ids=block, **{key: trial.pop("cache")}, use_cache=True, **extra)
            target.head(out.last_hidden_state[0]).argmax(-1).tolist()

        return trials.best(name, run, fresh)

    step = target_forward("target_step_s", tail[:1])
    chain, *others = sorted(set(sizes), key=lambda n: (n != sizes[0], n))
    points = {1: step, chain: target_forward(f"target_verify_s/{chain}", tail[:chain])}
    if walked is not None and walked.get("forward_s"):
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
        except Exception as exc:
            out["tree_verify_error"] = _error(exc)
    return out


def _tree_costs(
    forward, trials, points, target, cache, logits, root, base, budgets, topk
) -> dict[str, float]:
    """`forward`'s seconds over each budget's tree built from the drafter block's `logits`."""
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
    """What `measure` times on: the median-length sample and verify sizes."""

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
        return self.ids[: -max(self.sizes)]

    def key(self) -> dict:
        """What the target's costs depend on beyond host and target (a feature cache's context)."""
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
    """`doc` if it is a valid target part of a round's costs (`TARGET_COSTS`), else None."""
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
    """`round_costs` on `inputs`; a failure is ``{"error": line}``, never the eval's."""
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
    except Exception as exc:
        return {"error": _error(exc)}
