"""Where the remote engine computes: ``cpu`` (the default) or ``cuda[:i]`` where torch sees
a GPU. One resolution for every engine entry point (``eval`` and ``parity``), so a device
name means the same thing, and fails the same way, everywhere.

The engine loads weights on the CPU (the model reader materialises them there), moves the
target and drafter to the device, then makes the device torch's default for the rest of
the run, so every index and mask the walk builds lands beside the weights without a
device argument threaded through each call (`computing`, which on a CPU also picks how
bfloat16 products are computed: `remote.eval.cpu_bf16`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from remote.errors import UserError
from remote.protocol import DEVICE_RE


def check_name(name: str | None) -> str:
    """The device name, validated by form only (no torch import): ``cpu``, ``cuda``,
    ``cuda:N``; None is ``cpu``."""
    name = (name or "cpu").strip().lower()
    if not DEVICE_RE.match(name):
        raise UserError(f"device {name!r} is not supported; use cpu, cuda or cuda:N")
    return name


def resolve(name: str | None):
    """The `torch.device` for `name`; one clear line when cuda is asked and torch sees no
    GPU (a CPU-only torch build, no driver, or an index past the last GPU), or when
    ``DFLASH_CPU_BF16`` names no policy (`remote.eval.cpu_bf16`)."""
    import torch

    name = check_name(name)
    if name == "cpu":
        from remote.eval import cpu_bf16

        cpu_bf16.policy()  # a bad DFLASH_CPU_BF16 fails here, before any weight is read
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (a CPU-only build)"
        raise UserError(
            f"device {name} asked but torch {torch.__version__} sees no GPU on "
            f"this host (CUDA build: {build}); use --device cpu"
        )
    index = int(name.split(":")[1]) if ":" in name else 0
    if index >= torch.cuda.device_count():
        raise UserError(
            f"device {name} asked but torch sees {torch.cuda.device_count()} "
            f"GPU(s) on this host (cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )
    return torch.device("cuda", index)


def describe(device) -> dict:
    """What the result records about the device: its name and, for a GPU, the card."""
    import torch

    out = {"device": str(device)}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


@contextlib.contextmanager
def computing(device) -> Iterator[None]:
    """Compute the block on `device`: torch's default device for a GPU; on the CPU, its
    bfloat16 matrix products as `remote.eval.cpu_bf16.policy` says (in float32 where the
    CPU has no bfloat16 kernels). Enter it in the thread that computes."""
    import torch

    if device.type == "cpu":
        from remote.eval import cpu_bf16

        with cpu_bf16.widened():
            yield
        return
    before = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(before)


def bf16_products(device, dtype: str) -> str | None:
    """What a result records of how its bfloat16 products were computed: the CPU's
    policy (`remote.eval.cpu_bf16`), None on a GPU or in float32."""
    if device.type != "cpu" or dtype != "bfloat16":
        return None
    from remote.eval import cpu_bf16

    return cpu_bf16.policy()


def place(target, drafter, device) -> None:
    """Move the target's text part (backbone, embedding, head: the only materialised
    modules; the embedding and head alone of a target that is not ``whole``) and the
    drafter (if any) to `device`."""
    if device.type == "cpu":
        return
    parts = (target.backbone,) if target.whole else ()
    for module in (*parts, target.embedding, target.head):
        module.to(device)
    if drafter is not None:
        drafter.to(device)


# A target whose weight files are smaller than this (a test's or the demo's tiny model)
# runs fastest on one CPU thread: its matrices are too small to share out, and on a busy
# host torch's threads mostly wait for each other (benchmarks/eval_threads.py).
SMALL_TARGET_BYTES = 64 * 2**20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_bytes(folder: str) -> int:
    """Bytes of the weight files directly in the model `folder` (0 if none is readable)."""
    total = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
                total += entry.stat().st_size
        except OSError:
            continue
    return total


def auto_threads(target: str, device: str | None) -> tuple[int | None, str | None]:
    """The CPU threads a job that names none computes with, and why in a line: one for a
    target under `SMALL_TARGET_BYTES`; torch's own choice (None, no line) otherwise and
    on a GPU. The same folder always gets the same answer, so two runs of one eval
    compute alike (threads are a speed setting: the rounds do not depend on them)."""
    if check_name(device) != "cpu":
        return None, None
    size = weight_bytes(target)
    if not 0 < size < SMALL_TARGET_BYTES:
        return None, None
    return 1, (
        f"threads: 1, the target's weights being {size / 2**20:.1f} MiB (a model this small "
        "runs fastest on one thread; --threads N or the inventory's threads to choose)"
    )
