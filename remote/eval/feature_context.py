"""What every feature-cache entry of one eval shares in its key: the target, its layers,
dtype, device, attention and the CPU's numerics (docs/eval.md, the feature cache)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CACHE_VERSION = 1  # bumped when what an entry means changes, so older entries are never hit


def run_context(attn: str | None, target_dir: str, layer_ids: list[int], dtype, device) -> dict:
    """What every entry of one eval shares in its key (`remote.eval.feature_cache`); `attn`:
    the attention implementation the target runs with
    (`remote.model.load.attention_implementation`)."""
    import transformers

    from remote.eval import device as device_mod
    from remote.eval.groundtruth import target_identity

    identity = target_identity(target_dir)
    root = Path(target_dir)
    identity["mtimes_ns"] = [(n, (root / n).stat().st_mtime_ns) for n, _size in identity["weights"]]
    context = {
        "v": CACHE_VERSION,
        "target": identity,
        "layer_ids": list(layer_ids),
        "dtype": str(dtype).removeprefix("torch."),
        "device": device_mod.describe(device),
        "attn_implementation": attn,
        # CPU kernels may split their sums by thread, and pick their code by the CPU: the
        # count, the kernels' instruction set and the CPU's model are part of the numerics
        "cpu": cpu_numerics() if device.type == "cpu" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    return json.loads(json.dumps(context))  # as an entry's metadata reads back: lists, not tuples


def cpu_numerics() -> dict:
    """What a CPU's results depend on beyond the inputs: torch's threads, the instruction
    set its kernels dispatch to, the CPU's model name (a shared folder may be read by
    other machines, a Slurm array's nodes), how bfloat16 products are computed
    (`remote.eval.cpu_bf16`)."""
    model = None
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None
            )
    except OSError:
        pass
    from remote.eval import cpu_bf16

    return {
        "threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "model": model,
        "bf16_products": cpu_bf16.policy(),
    }
