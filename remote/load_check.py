"""``probe --load``: load the text backbone only, run a short forward, and check that each
hooked decoder-layer output equals ``hidden_states[i+1]``."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.model_files import one_line
from remote.structure import limited



def load_and_verify(folder: Path, meta_model, structure: dict, scan: dict,
                    mapping: dict[str, str], converted: set[str], dtype,
                    num_layers: int, hidden: int, vocab: int) -> dict:
    """Load the text backbone only, run a short forward, check hidden states against hooks.

    The backbone is built on the CPU without random init (``no_init_weights``) from its own
    config, so non-persistent buffers (rotary frequencies, embedding scales) are computed by
    its constructor, then filled from the checkpoint through the same key mapping the report
    shows. The vision tower is never allocated.
    """
    import torch
    from safetensors import safe_open

    if scan["missing_shards"] or scan["truncated_shards"]:
        bad = scan["missing_shards"] + [t["file"] for t in scan["truncated_shards"]]
        raise UserError(f"cannot --load {folder}: shards missing or truncated: {', '.join(bad)}")
    backbone_path = structure["backbone"]
    meta_bb = meta_model.get_submodule(backbone_path) if backbone_path else meta_model
    bb_config = getattr(meta_bb, "config", None)
    if bb_config is None or not hasattr(type(meta_bb), "_from_config"):
        raise UserError(f"--load: text backbone {backbone_path} ({type(meta_bb).__name__}) is "
                        "not a transformers model with its own config")
    prefix = backbone_path + "." if backbone_path else ""
    wanted = {mk[len(prefix):]: ck for ck, mk in mapping.items() if mk.startswith(prefix)}
    t0 = time.monotonic()
    if any(ck in converted for ck in wanted.values()):
        # Some tensors need more than a rename (per-expert MoE weights fused into one
        # tensor): let transformers load the backbone class itself, which applies the
        # conversions and skips every key outside the backbone (the vision tower).
        method = "backbone from_pretrained (tensor conversions needed)"
        try:
            model, info = type(meta_bb).from_pretrained(
                str(folder), config=copy.deepcopy(bb_config), dtype=dtype,
                output_loading_info=True)
        except Exception as exc:
            raise UserError(f"--load: transformers could not load {type(meta_bb).__name__} "
                            f"from {folder}: {one_line(exc)}") from None
        missing = sorted(info.get("missing_keys", []))
    else:
        method = "text keys only, mapped as reported"
        from transformers.initialization import no_init_weights
        with no_init_weights():
            model = type(meta_bb)._from_config(copy.deepcopy(bb_config), dtype=dtype)
        by_file: dict[str, list[tuple[str, str]]] = {}
        for rel, ck in wanted.items():
            by_file.setdefault(scan["keys"][ck][0], []).append((rel, ck))
        state = {}
        for fname, pairs in by_file.items():
            with safe_open(str(folder / fname), framework="pt") as fh:
                for rel, ck in pairs:
                    state[rel] = fh.get_tensor(ck).to(dtype)
        result = model.load_state_dict(state, strict=False)
        del state
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        missing = sorted(result.missing_keys)
    model.eval()
    load_s = time.monotonic() - t0
    layers = model.get_submodule(structure["layers"][len(prefix):])
    embed = model.get_submodule(structure["embed_tokens"][len(prefix):])
    norm = model.get_submodule(structure["norm"][len(prefix):]) if structure["norm"] else None
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
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    except Exception as exc:
        raise UserError(f"--load: forward of {type(model).__name__} failed: {one_line(exc)}") from None
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
            last = "final_normed" if torch.allclose(normed, hs[-1], atol=1e-5, rtol=1e-4) else "other"
        else:
            last = "other"
    embed_ok = count_ok and -1 in captured and torch.equal(captured[-1], hs[0])
    return {
        "backbone_class": type(model).__name__,
        "dtype": str(dtype).replace("torch.", ""),
        "method": method,
        "tensors_loaded": len(wanted),
        "missing_after_load": limited(missing),
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
        "ok": bool(count_ok and shapes_ok and not mismatched and not missing),
    }
