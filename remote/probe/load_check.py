"""``probe --load``: load the text part as the eval does and check the hooked layer outputs
against ``hidden_states`` (docs/probe.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.model.files import one_line
from remote.model.keys import limited
from remote.model.layout import TextLayout
from remote.model.load import load_text


def load_and_verify(folder: Path, layout: TextLayout, scan: dict) -> dict:
    """Load the text part with the engine's loader, in its config's dtype, so a pass here
    means the eval loads the same tensors; run random tokens and compare."""
    import torch

    t0 = time.monotonic()
    d = load_text(folder, None)
    load_s = time.monotonic() - t0
    model, layout = d.model, d.layout
    backbone = model.get_submodule(layout.backbone_path) if layout.backbone_path else model
    layers = model.get_submodule(layout.layers_path)
    embed = model.get_submodule(layout.embed_path)
    norm = model.get_submodule(layout.norm_path) if layout.norm_path else None
    num_layers, hidden, vocab = layout.num_layers, layout.hidden_size, layout.vocab_size
    captured: dict[int, Any] = {}
    hooks = []

    def keep(idx):
        def hook(_m, _i, out):
            captured[idx] = (out[0] if isinstance(out, (tuple, list)) else out).detach()

        return hook

    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(keep(i)))
    hooks.append(embed.register_forward_hook(keep(-1)))
    g = torch.Generator().manual_seed(0)
    seq = 8
    ids = torch.randint(0, vocab, (1, seq), generator=g)
    t1 = time.monotonic()
    try:
        with torch.no_grad():
            out = backbone(input_ids=ids, output_hidden_states=True, use_cache=False)
    except Exception as exc:
        raise UserError(
            f"--load: transformers cannot run the text part of "
            f"{layout.architecture} ({type(backbone).__name__}) on its own: "
            f"{one_line(exc)}"
        ) from None
    finally:
        for h in hooks:
            h.remove()
    forward_s = time.monotonic() - t1
    hs = out.hidden_states
    count_ok = hs is not None and len(hs) == num_layers + 1
    shapes_ok = bool(hs) and all(tuple(h.shape) == (1, seq, hidden) for h in hs)
    mismatched = []
    if count_ok:
        for i in range(num_layers - 1):
            if i not in captured or not torch.equal(captured[i], hs[i + 1]):
                mismatched.append(i)
    last = "unknown"
    if count_ok and num_layers - 1 in captured:
        raw_last = captured[num_layers - 1]
        if torch.equal(raw_last, hs[-1]):
            last = "raw"
        elif norm is not None:
            with torch.no_grad():
                normed = norm(raw_last)
            last = (
                "final_normed" if torch.allclose(normed, hs[-1], atol=1e-5, rtol=1e-4) else "other"
            )
        else:
            last = "other"
    # Scaled embeddings (Gemma) enter the stack scaled: hidden_states[0] is the scaled one.
    embed_ok = count_ok and -1 in captured and torch.equal(captured[-1], hs[0])
    text_params = [k for k, _ in model.named_parameters() if layout.in_text(k)]
    return {
        "backbone_class": type(backbone).__name__,
        "dtype": str(d.dtype).replace("torch.", ""),
        "method": "transformers loader, text keys only (as the eval engine loads)",
        "tensors_loaded": len(text_params),
        "missing_after_load": limited([]),
        "load_seconds": round(load_s, 3),
        "forward_seconds": round(forward_s, 3),
        "sequence_length": seq,
        "hidden_states": len(hs) if hs is not None else 0,
        "hidden_states_expected": num_layers + 1,
        "hidden_state_width_ok": shapes_ok,
        "embedding_is_hidden_states_0": bool(embed_ok),
        "layer_outputs_match": count_ok and not mismatched,
        "mismatched_layers": mismatched,
        "last_hidden_state": last,
        "ok": bool(count_ok and shapes_ok and not mismatched),
    }
