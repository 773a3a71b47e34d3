"""bfloat16 products on a CPU (`remote.eval.cpu_bf16`): which way a host goes, and that the
widened way gives torch's own float32 products rounded to bfloat16 once, for the calls a
model makes (linear layers, ``matmul``, ``@``, ``bmm``), and leaves every other call alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from remote.errors import UserError
from remote.eval import cpu_bf16
from remote.eval.device import bf16_products, computing, resolve
from remote.eval.feature_context import cpu_numerics

BF16 = torch.bfloat16


def rand(*shape, dtype=BF16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def test_policy_follows_the_cpu_unless_the_environment_names_one(monkeypatch):
    monkeypatch.delenv(cpu_bf16.ENV, raising=False)
    expected = "native" if cpu_bf16.native_supported() else "float32"
    assert cpu_bf16.policy() == expected
    assert bf16_products(torch.device("cpu"), "bfloat16") == expected
    assert bf16_products(torch.device("cpu"), "float32") is None
    for chosen in cpu_bf16.POLICIES:
        monkeypatch.setenv(cpu_bf16.ENV, chosen.upper())
        assert cpu_bf16.policy() == chosen
        # a feature cache made one way is never read the other way
        assert cpu_numerics()["bf16_products"] == chosen
    monkeypatch.setenv(cpu_bf16.ENV, "fast")
    with pytest.raises(UserError) as err:
        resolve("cpu")  # before any weight is read
    assert str(err.value) == "DFLASH_CPU_BF16='fast' is not supported; use native or float32"


def test_widened_products_are_float32_products_rounded_once(monkeypatch):
    calls = []
    real_linear = cpu_bf16.linear
    monkeypatch.setattr(cpu_bf16, "linear", lambda *a: calls.append(len(a)) or real_linear(*a))
    convs, real_conv = [], cpu_bf16.conv
    monkeypatch.setattr(
        cpu_bf16, "conv", lambda f, *a, **k: convs.append(f.__name__) or real_conv(f, *a, **k)
    )
    x, w, b = rand(3, 5, 64), rand(48, 64), rand(48)
    q, k = rand(2, 7, 16), rand(2, 16, 9)
    # a Gated DeltaNet layer's depthwise causal convolution, as the engine's kernel calls it
    sig, taps, cb = rand(1, 6, 1, 11), rand(6, 1, 1, 4), rand(6)
    with cpu_bf16.widened("float32") as chosen:
        got = {
            "linear": F.linear(x, w),
            "linear+bias": F.linear(x, w, b),
            "matmul": torch.matmul(q, k),
            "@": q @ k,
            "bmm": torch.bmm(q, k),
            "float32": F.linear(x.float(), w.float()),
            "conv2d": F.conv2d(sig, taps, cb, padding=(0, 3), groups=6),
            "conv1d": F.conv1d(sig[:, :, 0], taps[:, :, 0], bias=cb, padding=3, groups=6),
        }
    assert chosen == "float32" and calls == [2, 3]  # both linear layers went through it
    assert convs == ["conv2d", "conv1d"]
    want = {
        "linear": F.linear(x.float(), w.float()).to(BF16),
        "linear+bias": F.linear(x.float(), w.float(), b.float()).to(BF16),
        "matmul": (q.float() @ k.float()).to(BF16),
        "@": (q.float() @ k.float()).to(BF16),
        "bmm": torch.bmm(q.float(), k.float()).to(BF16),
        "float32": F.linear(x.float(), w.float()),
        "conv2d": F.conv2d(sig.float(), taps.float(), cb.float(), padding=(0, 3), groups=6).to(
            BF16
        ),
        "conv1d": F.conv1d(
            sig[:, :, 0].float(), taps[:, :, 0].float(), bias=cb.float(), padding=3, groups=6
        ).to(BF16),
    }
    for name, value in got.items():
        assert value.dtype == want[name].dtype and torch.equal(value, want[name]), name
    # outside the block, and under `native`, torch's own bfloat16 kernels run again
    with cpu_bf16.widened("native"):
        F.linear(x, w)
    F.linear(x, w)
    assert calls == [2, 3]


def test_a_large_weight_is_widened_a_slice_at_a_time(monkeypatch):
    x, w, b = rand(6, 32), rand(100, 32), rand(100)
    whole = cpu_bf16.linear(x, w, b)
    widened = []
    real_float = torch.Tensor.float
    monkeypatch.setattr(cpu_bf16, "SLICE_ELEMENTS", 30 * 32)
    monkeypatch.setattr(torch.Tensor, "float", lambda t: widened.append(t.numel()) or real_float(t))
    sliced = cpu_bf16.linear(x, w, b)
    monkeypatch.undo()
    assert sliced.dtype == BF16 and sliced.shape == (6, 100)
    assert max(widened) <= 30 * 32  # no float32 copy of the whole weight
    torch.testing.assert_close(sliced, whole, rtol=0, atol=0)


def test_a_few_rows_read_the_bfloat16_weight_without_widening(monkeypatch):
    """Up to `NATIVE_ROWS` rows torch's own kernel runs, summing in float32: within one
    bfloat16 step of the exact product; a row more and the weight is widened again."""
    widened = []
    real_widen = cpu_bf16.widen
    monkeypatch.setattr(cpu_bf16, "widen", lambda t: widened.append(t.shape) or real_widen(t))
    w, b = rand(48, 64), rand(48)
    for rows in range(1, cpu_bf16.NATIVE_ROWS + 1):
        x = rand(rows, 64)
        got = cpu_bf16.linear(x, w, b)
        exact = F.linear(x.double(), w.double(), b.double())
        assert got.dtype == BF16 and got.shape == (rows, 48)
        assert ((got.double() - exact).abs() <= exact.abs() * 2**-7 + 1e-3).all(), rows
    assert widened == []
    cpu_bf16.linear(rand(cpu_bf16.NATIVE_ROWS + 1, 64), w, b)
    assert widened == [(48, 64)]


def test_without_autograd_weights_are_widened_into_one_reused_buffer(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "SLICE_ELEMENTS", 30 * 32)
    monkeypatch.setattr(cpu_bf16._scratch, "buf", None, raising=False)  # this thread's, afresh
    x, big, small = rand(6, 32), rand(100, 32), rand(7, 32)
    want = {"big": cpu_bf16.linear(x, big), "small": cpu_bf16.linear(x, small)}
    with torch.inference_mode():
        first = cpu_bf16.linear(x, big)
        buffer = cpu_bf16._scratch.buf
        again = {"big": cpu_bf16.linear(x, big), "small": cpu_bf16.linear(x, small)}
    assert buffer.numel() <= 30 * 32  # a slice's worth, never the whole weight
    assert cpu_bf16._scratch.buf.data_ptr() == buffer.data_ptr()  # reused, not reallocated
    for name, value in again.items():
        assert torch.equal(value, want[name]), name
    assert torch.equal(first, want["big"])
    # with autograd on, the product keeps its own copy and gradients reach the weight
    w = rand(8, 32).requires_grad_()
    cpu_bf16.linear(x, w).float().sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_computing_on_the_cpu_widens_as_the_policy_says(monkeypatch):
    x, w = rand(2, 64), rand(8, 64)
    seen = []
    real_linear = cpu_bf16.linear
    monkeypatch.setattr(cpu_bf16, "linear", lambda *a: seen.append(1) or real_linear(*a))
    for chosen, widens in (("float32", True), ("native", False)):
        monkeypatch.setenv(cpu_bf16.ENV, chosen)
        seen.clear()
        with computing(torch.device("cpu")):
            F.linear(x, w)
        assert bool(seen) == widens, chosen
