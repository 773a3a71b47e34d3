"""The DFlash drafter checkpoint format, shared by the engine and the probe so that what
the probe says will load is what the engine loads; torch only for ``.pt``/``.bin``."""

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
    """z-lab's layer ids when a config names none (``build_target_layer_ids``)."""
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
    """The files holding a drafter's weights: `path`, its index's shards, or its folder's
    weight files of one kind (no optimizer, scheduler or RNG states)."""
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
    """The tensors of one weight file (``.pt`` and kin weights-only); else one line."""
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
    """(raw key -> (file, dtype, shape), problems) of the drafter weights, found as the
    engine finds them; a missing or truncated shard is a problem, not an exception."""
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
