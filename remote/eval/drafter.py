"""The DFlash drafter loaded from and saved as a checkpoint (format: `remote.model.
drafter_format`), and the drafter names the engine imports. Imports torch: import it lazily."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from remote.errors import UserError
from remote.eval.drafter_config import DrafterConfig as DrafterConfig
from remote.eval.drafter_config import read_config as read_config
from remote.eval.drafter_layers import Rotary
from remote.eval.drafter_layers import apply_rope as apply_rope
from remote.eval.drafter_model import Blocks as Blocks
from remote.eval.drafter_model import ContextKV as ContextKV
from remote.eval.drafter_model import DFlashDrafter as DFlashDrafter
from remote.model.drafter_format import default_target_layer_ids as default_target_layer_ids
from remote.model.drafter_format import normalise_key as normalise_key
from remote.model.drafter_format import read_state as _read_state
from remote.model.drafter_format import weight_files as _weight_files
from remote.model.drafter_format import weight_shapes as weight_shapes

# Saved beside the drafter by some trainers but not its weights: skipped, and reported.
IGNORABLE_KEYS = ("embed_tokens.weight", "lm_head.weight", "rotary_emb.inv_freq")


@dataclass
class LoadReport:
    files: list[str]
    source_dtypes: list[str]
    ignored_keys: list[str]
    parameters: int


def load_drafter(
    path: str,
    dtype: torch.dtype = torch.bfloat16,
    num_target_layers: int | None = None,
) -> tuple[DFlashDrafter, LoadReport]:
    """Load a drafter in any form docs/dflash-eval.md lists, cast to ``dtype``; a `UserError`
    names any key that does not map, a missing key, or a wrong ``fc`` width."""
    cfg = read_config(path, num_target_layers)
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    expected = {k: v for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    ignored, unknown, dtypes = [], [], set()
    files = _weight_files(path)
    for f in files:
        for raw_key, t in _read_state(f).items():
            key = normalise_key(raw_key)
            if key in expected:
                state[key] = t
                dtypes.add(str(t.dtype).replace("torch.", ""))
            elif key in IGNORABLE_KEYS or key.endswith("rotary_emb.inv_freq"):
                ignored.append(raw_key)
            else:
                unknown.append(raw_key)
    if unknown:
        raise UserError(
            "drafter weights have keys that do not map to a "
            f"DFlash drafter: {', '.join(sorted(unknown)[:8])}"
        )
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UserError(
            f"drafter weights lack {', '.join(missing[:8])}; "
            f"is {path} a complete DFlash checkpoint?"
        )
    fc_in = state["fc.weight"].shape[1]
    want = len(cfg.target_layer_ids) * cfg.hidden_size
    if fc_in != want:
        raise UserError(
            f"drafter fc takes {fc_in} features but {len(cfg.target_layer_ids)} "
            f"target layers x hidden {cfg.hidden_size} = {want}; "
            "fix target_layer_ids in the drafter config"
        )
    for key, t in state.items():
        if tuple(t.shape) != tuple(expected[key].shape):
            raise UserError(
                f"drafter weight {key} has shape {tuple(t.shape)}, "
                f"config implies {tuple(expected[key].shape)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True, strict=False)
    model.rotary = Rotary(cfg)  # rebuilt off meta
    model.eval().requires_grad_(False)
    report = LoadReport(
        files=files,
        source_dtypes=sorted(dtypes),
        ignored_keys=ignored,
        parameters=sum(t.numel() for t in state.values()),
    )
    return model, report


def save_zlab(model: DFlashDrafter, folder: str) -> None:
    """Write ``model`` as a z-lab checkpoint: ``config.json`` + ``model.safetensors``."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if "rotary" not in k}
    save_file(state, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(model.cfg.raw, fh, indent=2)
