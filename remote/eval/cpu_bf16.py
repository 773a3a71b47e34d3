"""bfloat16 matrix products on CPUs without bfloat16 instructions.

torch multiplies bfloat16 matrices on a CPU with oneDNN's bfloat16 kernels where oneDNN
supports bfloat16 there (AVX-512: Xeons since Skylake, AMD since Zen 4; or AVX-NE-CONVERT).
Elsewhere (AMD Zen 2 and 3, Xeons before Skylake, most desktop chips: many CPU eval hosts)
it falls back to a generic loop several times slower than its float32 kernels, and the
eval's linear layers, nearly all of its work, go that slow.

There the engine computes each bfloat16 product in float32 instead: the operands are
widened exactly (every bfloat16 is a float32), multiplied by the float32 kernels, which
sum in float32 as the bfloat16 kernels do, and the product is rounded to bfloat16 once, as
theirs is. Only the order of the float32 sums differs, as it already does between one
CPU's kernels and another's (either way about one product element in 10,000 is a bfloat16
step off the exactly rounded one), so a near-tie may fall the other way, as it may on
another CPU; the rest of the model stays in bfloat16.

`policy()` says which way this host goes (``DFLASH_CPU_BF16=native|float32`` overrides
the CPU's answer, for comparisons); `widened()` is the context the engine computes in.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from remote.errors import UserError

POLICIES = ("native", "float32")
ENV = "DFLASH_CPU_BF16"
# A weight is widened this many elements at a time (256 MiB of float32), so that a large
# vocabulary's head never has a float32 copy of its own.
SLICE_ELEMENTS = 64 << 20


def native_supported() -> bool:
    """Whether torch multiplies bfloat16 matrices with the CPU's own bfloat16 kernels."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def policy() -> str:
    """``native`` (torch's bfloat16 products) or ``float32`` (widened, see the module):
    ``DFLASH_CPU_BF16`` when set, else ``native`` exactly where the CPU has bfloat16
    kernels."""
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen:
        if chosen not in POLICIES:
            raise UserError(f"{ENV}={chosen!r} is not supported; use native or float32")
        return chosen
    return "native" if native_supported() else "float32"


def _both_cpu_bf16(a, b) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype == torch.bfloat16
        and a.device.type == b.device.type == "cpu"
    )


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` of bfloat16 `x` and `w` computed in float32, rounded to bfloat16;
    a large `w` is widened a slice of its rows (output features) at a time."""
    bias = None if b is None else b.float()
    if w.numel() <= SLICE_ELEMENTS:
        return F.linear(x.float(), w.float(), bias).to(torch.bfloat16)
    xf = x.float()
    out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=torch.bfloat16, device=x.device)
    step = max(1, SLICE_ELEMENTS // w.shape[1])
    for start in range(0, w.shape[0], step):
        end = min(start + step, w.shape[0])
        part = None if bias is None else bias[start:end]
        out[..., start:end] = F.linear(xf, w[start:end].float(), part)
    return out


class _Widened(TorchFunctionMode):
    """Routes bfloat16 CPU matrix products (linear layers, ``matmul``, ``@``, ``bmm``)
    through float32; every other call, and every product on another dtype or device,
    runs as it is."""

    PRODUCTS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and not kwargs and len(args) in (2, 3):
            if _both_cpu_bf16(args[0], args[1]) and (
                len(args) == 2 or args[2] is None or args[2].dtype == torch.bfloat16
            ):
                return linear(*args)
        elif func in self.PRODUCTS and not kwargs and len(args) == 2:
            a, b = args
            if _both_cpu_bf16(a, b):
                return func(a.float(), b.float()).to(torch.bfloat16)
        return func(*args, **kwargs)


@contextlib.contextmanager
def widened(chosen: str | None = None) -> Iterator[str]:
    """Compute the block's bfloat16 CPU products as `chosen` (default: `policy()`) says;
    yields the policy. Torch's function modes are per thread: the thread that computes
    enters it."""
    chosen = chosen or policy()
    if chosen == "native":
        yield chosen
        return
    with _Widened():
        yield chosen
