"""bfloat16 matrix products in float32 on CPUs without bf16 kernels (docs/eval.md)."""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from remote.errors import UserError

POLICIES = ("native", "float32")
ENV = "DFLASH_CPU_BF16"
# Widened a slice at a time, small enough to stay in the CPU's cache from its widening to
# its product: a slice written to memory and read back costs more than the product.
SLICE_ELEMENTS = 4 << 20
# at this many rows or fewer a product reads the bfloat16 weight directly
NATIVE_ROWS = 4
_scratch = threading.local()


def native_supported() -> bool:
    """Whether torch multiplies bfloat16 matrices with the CPU's own bfloat16 kernels."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def policy() -> str:
    """``DFLASH_CPU_BF16``, else ``native`` where the CPU has bf16 kernels."""
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


def widen(w: torch.Tensor) -> torch.Tensor:
    """`w` (a slice at most) in float32: without autograd, in this thread's reused buffer,
    since a fresh float32 copy costs several times the conversion in page faults
    (docs/eval.md)."""
    if torch.is_grad_enabled():
        return w.float()
    n = w.numel()
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < n:
        _scratch.buf = None  # the old buffer goes before the larger one comes
        with torch.inference_mode(False):
            buf = _scratch.buf = torch.empty(n, dtype=torch.float32)
    return buf[:n].view(w.shape).copy_(w)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` of bfloat16 `x` and `w` in float32, rounded to bfloat16 once.

    Up to `NATIVE_ROWS` rows torch's own bfloat16 kernel runs: its matrix-vector loop reads
    the bfloat16 weight once and sums in float32, faster than any widening. Otherwise each
    slice's product is taken as ``w @ x.T``, which MKL runs faster at few rows than
    ``x @ w.T`` (docs/eval.md)."""
    rows = math.prod(x.shape[:-1])
    if rows <= NATIVE_ROWS:
        return F.linear(x, w, b)
    xt = x.reshape(rows, x.shape[-1]).float().t()
    out = torch.empty((rows, w.shape[0]), dtype=torch.bfloat16, device=x.device)
    step = max(1, SLICE_ELEMENTS // max(1, w.shape[1]))
    for start in range(0, w.shape[0], step):
        end = min(start + step, w.shape[0])
        part = widen(w[start:end])
        if b is None:
            out[:, start:end] = torch.mm(part, xt).t()
        else:
            out[:, start:end] = torch.addmm(b[start:end, None].float(), part, xt).t()
    return out.view(*x.shape[:-1], w.shape[0])


def conv(func, x: torch.Tensor, w: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """`func` (``F.conv1d`` or ``F.conv2d``) of bfloat16 `x` and `w` in float32, rounded
    to bfloat16 once; a bfloat16 bias is widened too."""
    args = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
    if isinstance(kwargs.get("bias"), torch.Tensor):
        kwargs = {**kwargs, "bias": kwargs["bias"].float()}
    return func(x.float(), w.float(), *args, **kwargs).to(torch.bfloat16)


class _Widened(TorchFunctionMode):
    """Routes bfloat16 CPU matrix products and convolutions through float32; every other
    call runs as is."""

    PRODUCTS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm)
    # a Gated DeltaNet layer's depthwise causal convolution: torch's bf16 fallback loops
    # over the channels one group at a time
    CONVS = (F.conv1d, F.conv2d)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.CONVS and len(args) >= 2 and _both_cpu_bf16(args[0], args[1]):
            return conv(func, *args, **kwargs)
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
    """Compute bf16 CPU products as `chosen` says, in the computing thread."""
    chosen = chosen or policy()
    if chosen == "native":
        yield chosen
        return
    with _Widened():
        yield chosen
