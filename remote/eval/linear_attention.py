"""The CPU kernels of a target's linear-attention layers (`remote.eval.gated_delta`), put
where transformers would fall back to its reference PyTorch path.

transformers' Gated DeltaNet layers (Qwen3.5, Qwen3.6, Qwen3-Next and their MoE
variants) call their kernels through per-layer hooks: each layer instance holds its own
wrapper of ``torch_chunk_gated_delta_rule`` and ``causal_conv1d_fn`` (``_kernel_funcs``,
the `kernels` package's ``use_kernelized_func``, which ``kernelize`` uses to swap in a
Hub kernel). `install` points the wrappers of one model's layers at this engine's CPU
kernels, leaving every other model in the process as transformers made it. A call with
its tensors on another device, or with packed sequences (``cu_seqlens``), goes to what
transformers chose (flash-linear-attention on a GPU where installed).

`kind` says which implementation a target's linear-attention layers run, for the
result's environment: ``cpu-chunked`` (these kernels), ``transformers`` (its own choice:
the layers take no hook in this transformers, or ``DFLASH_LINEAR_ATTENTION=transformers``
asked for it, e.g. to compare the two with ``dflash parity``), or None (no such layers).
"""

from __future__ import annotations

import os
from types import MethodType

from torch import nn

from remote.errors import UserError
from remote.eval import gated_delta

# The hooks this engine fills, by the name transformers gives the function, and the
# parameters the replacement must accept (a renamed argument leaves transformers' own).
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
    """Point `model`'s linear-attention kernel hooks at this engine's CPU kernels; returns
    `kind` of it afterwards (unchanged when `chosen` says ``transformers``). Idempotent."""
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
    """``cpu-chunked`` when every kernel hook of `model` runs ours, ``transformers``
    when it has linear-attention layers we left to transformers, None when it has none."""
    hooks = list(_hooks(model))
    if not hooks:
        return _plain(model)
    ours = all(
        getattr(h.__dict__.get("forward"), "__name__", "").startswith("dflash_")
        for _l, _n, h in hooks
    )
    return OWN if ours else THEIRS


def _plain(model: nn.Module) -> str | None:
    """`kind` of a model without hooks: ``transformers`` when some layer is a linear-
    attention one (its class names a DeltaNet), else None."""
    names = {type(m).__name__ for m in model.modules()}
    return THEIRS if any("DeltaNet" in n for n in names) else None
