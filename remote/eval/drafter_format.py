"""Facts about the DFlash drafter checkpoint format that need no torch.

Shared by the eval engine (`remote.eval.drafter`) and the probe (`remote.probe.structure`)
so that what the probe says will load is exactly what the engine loads.
"""

from __future__ import annotations

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
