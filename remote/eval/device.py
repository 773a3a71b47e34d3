"""Where the engine computes (``cpu`` or ``cuda[:i]``), resolved once for eval and parity."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from remote.errors import UserError
from remote.protocol import DEVICE_RE


def check_name(name: str | None) -> str:
    """The device name (None: ``cpu``), checked by form only, without importing torch."""
    name = (name or "cpu").strip().lower()
    if not DEVICE_RE.match(name):
        raise UserError(f"device {name!r} is not supported; use cpu, cuda or cuda:N")
    return name


def resolve(name: str | None):
    """The `torch.device` for `name`; one line when there is no such GPU or CPU policy."""
    import torch

    name = check_name(name)
    if name == "cpu":
        from remote.eval import cpu_bf16

        cpu_bf16.policy()
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
    """Compute the block on `device`, entered in the computing thread."""
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
    """How a result's bfloat16 products were computed: the CPU's policy, else None."""
    if device.type != "cpu" or dtype != "bfloat16":
        return None
    from remote.eval import cpu_bf16

    return cpu_bf16.policy()


def place(target, drafter, device) -> None:
    """Move the target's materialised text modules and the drafter (if any) to `device`."""
    if device.type == "cpu":
        return
    parts = (target.backbone,) if target.whole else ()
    for module in (*parts, target.embedding, target.head):
        module.to(device)
    if drafter is not None:
        drafter.to(device)


# A smaller target runs fastest on one CPU thread (docs/eval.md, "Threads").
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
    """CPU threads for a job naming none, and why; stable per folder."""
    if check_name(device) != "cpu":
        return None, None
    size = weight_bytes(target)
    if not 0 < size < SMALL_TARGET_BYTES:
        return None, None
    return 1, (
        f"threads: 1, the target's weights being {size / 2**20:.1f} MiB (a model this small "
        "runs fastest on one thread; --threads N or the inventory's threads to choose)"
    )
