"""Points one target's Gated DeltaNet kernel hooks at the CPU kernels (docs/eval.md)."""

from __future__ import annotations

import os
from types import MethodType

from torch import nn

from remote.errors import UserError
from remote.eval import gated_delta

# hooks by transformers' function name, with the parameters a replacement must accept
KERNELS = {
    "chunk_gated_delta_rule": gated_delta.chunk_gated_delta_rule,
    "causal_conv1d_fn": gated_delta.causal_conv1d_fn,
}
OWN = "cpu-chunked"
THEIRS = "transformers"
ENV = "DFLASH_LINEAR_ATTENTION"


def chosen() -> str:
    """``DFLASH_LINEAR_ATTENTION`` (``cpu-chunked``, the default, or ``transformers``)."""
    got = os.environ.get(ENV, "").strip().lower() or OWN
    if got not in (OWN, THEIRS):
        raise UserError(f"{ENV}={got!r} is not supported; use {OWN} or {THEIRS}")
    return got


def _routed(name: str, theirs, ours):
    """The hook's forward: `ours` for CPU tensors of one sequence, else `theirs`."""

    def forward(_self, *args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if hasattr(a, "device")), None)
        packed = kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None
        if first is None or first.device.type != "cpu" or packed:
            return theirs(*args, **kwargs)
        return ours(*args, **kwargs)

    forward.__name__ = f"dflash_{name}"
    return forward


def _hooks(model: nn.Module):
    """(layer, name, hook module) of every hook of `model` that `KERNELS` names."""
    for module in model.modules():
        for name, hook in (module.__dict__.get("_kernel_funcs") or {}).items():
            if name in KERNELS and isinstance(hook, nn.Module):
                yield module, name, hook


def install(model: nn.Module) -> str | None:
    """Point `model`'s kernel hooks at the CPU kernels unless `chosen` says not; `kind`."""
    if chosen() == THEIRS:
        return kind(model)
    found = False
    for _layer, name, hook in _hooks(model):
        found = True
        current = hook.__dict__.get("forward")
        if getattr(current, "__name__", "").startswith("dflash_"):
            continue
        # a bound method, as ``kernelize`` sets one (the `kernels` wrapper reads its __func__)
        hook.forward = MethodType(_routed(name, hook.forward, KERNELS[name]), hook)
    return kind(model) if found else _plain(model)


def kind(model: nn.Module) -> str | None:
    """``cpu-chunked``, ``transformers`` or None (no linear-attention layers)."""
    hooks = list(_hooks(model))
    if not hooks:
        return _plain(model)
    ours = all(
        getattr(h.__dict__.get("forward"), "__name__", "").startswith("dflash_")
        for _l, _n, h in hooks
    )
    return OWN if ours else THEIRS


def _plain(model: nn.Module) -> str | None:
    names = {type(m).__name__ for m in model.modules()}
    return THEIRS if any("DeltaNet" in n for n in names) else None
