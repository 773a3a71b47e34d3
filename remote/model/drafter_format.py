"""The DFlash drafter checkpoint format: its key names, its default target layers, the
files that hold its weights and their shapes.

Shared by the eval engine (`remote.eval.drafter`) and the probe (`remote.probe`) so that
what the probe says will load is exactly what the engine loads. torch is imported only to
read a ``.pt``/``.bin`` file (`read_state`).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from remote.errors import UserError
from remote.model.files import read_header

if TYPE_CHECKING:
    import torch

# Prefixes training code wraps drafter keys in (DDP, torch.compile, HF wrappers, trainers).
KEY_PREFIXES = ("module.", "_orig_mod.", "model.", "draft_model.", "drafter.")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The layer ids z-lab uses when a config names none (their ``build_target_layer_ids``,
    https://github.com/z-lab/dflash)."""
    n, k = num_target_layers, num_draft_layers
    if k == 1:
        return [n // 2]
    return [int(round(1 + i * (n - 4) / (k - 1))) for i in range(k)]


def normalise_key(key: str) -> str:
    """Strip any stack of training wrapper prefixes (``module._orig_mod.model.x`` -> ``x``)."""
    changed = True
    while changed:
        changed = False
        for p in KEY_PREFIXES:
            if key.startswith(p):
                key, changed = key[len(p) :], True
    return key


def weight_files(path: str) -> list[str]:
    """The files holding a drafter's weights: `path` itself, the shards its index names, or
    the weight files of one kind in its folder (optimizer, scheduler and RNG states left
    out)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise UserError(f"drafter path {path} does not exist; pass the checkpoint folder")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as fh:
            shards = sorted(set(json.load(fh)["weight_map"].values()))
        return [os.path.join(path, s) for s in shards]
    names = sorted(os.listdir(path))
    for ext in (".safetensors", ".pt", ".bin", ".pth"):
        found = [
            os.path.join(path, n)
            for n in names
            if n.endswith(ext) and not n.startswith(("optimizer", "scheduler", "rng"))
        ]
        if found:
            return found
    raise UserError(f"no drafter weights (*.safetensors, *.pt, *.bin) in {path}")


def read_state(file: str) -> dict[str, torch.Tensor]:
    """The tensors of one weight file: safetensors as they are, ``.pt``/``.bin``/``.pth``
    through ``torch.load(weights_only=True)`` (a trainer's nesting one level down undone);
    anything else is one line."""
    import torch

    if file.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(file)
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(
            f"{file} is not a weights-only state dict ({type(exc).__name__}); "
            "save it with torch.save(model.state_dict())"
        ) from None
    # Trainer checkpoints often nest the weights one level down.
    for nest in ("state_dict", "model", "module", "draft_model", "model_state_dict"):
        if (
            isinstance(obj, dict)
            and isinstance(obj.get(nest), dict)
            and not isinstance(obj.get(nest), torch.Tensor)
        ):
            inner = obj[nest]
            if inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"{file} does not hold a flat state dict of tensors")
    return obj


def weight_shapes(path: str) -> tuple[dict[str, tuple[str, str, list[int]]], list[str]]:
    """(raw key -> (file, dtype, shape), problems) of the drafter weights, found the way
    `remote.eval.drafter.load_drafter` finds and reads them: the same files
    (`weight_files`), safetensors from their headers, ``.pt``/``.bin`` through the same
    ``torch.load(weights_only=True)`` (`read_state`).
    Missing or truncated shards are problems (one line each), not exceptions."""
    keys: dict[str, tuple[str, str, list[int]]] = {}
    problems: list[str] = []
    for f in weight_files(path):
        name = os.path.basename(f)
        if not os.path.isfile(f):
            problems.append(f"drafter shard {name} listed in the index is missing")
            continue
        if f.endswith(".safetensors"):
            header = read_header(f)
            if header.data_end > header.size:
                problems.append(
                    f"drafter shard {name} is truncated ({header.size} of {header.data_end} bytes)"
                )
            for k, info in header.tensors.items():
                keys[k] = (name, info["dtype"], [int(d) for d in info["shape"]])
        else:
            for k, t in read_state(f).items():
                keys[k] = (name, str(t.dtype).replace("torch.", ""), list(t.shape))
    return keys, problems
