"""Which model a target folder holds, as comparable facts: are two hosts' targets copies
of one checkpoint? (docs/parity.md). Nothing is read beyond what the model reader found."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

VOLATILE_KEYS = {
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "architectures",
    "auto_map",
    "use_cache",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
}


def _stable(cfg: dict) -> dict:
    return {
        k: v
        for k, v in sorted(cfg.items())
        if k not in VOLATILE_KEYS and not k.endswith("token_id") and not k.startswith("_")
    }


def _text_name(key: str, layout) -> str:
    """A text weight's module key relative to the text part, however deep it nests."""
    if layout.head_path and (key == layout.head_path or key.startswith(layout.head_path + ".")):
        return "head" + key[len(layout.head_path) :]
    if layout.backbone_path:
        return "backbone" + key[len(layout.backbone_path) :]
    return "backbone." + key


def target_identity(described, scan: dict, wanted: dict[str, str]) -> dict:
    """The identity of the described target, from `remote.model.load.plan_text`'s answers."""
    layout = described.layout
    raw = described.raw
    text_raw = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    rows = []
    dtypes: Counter = Counter()
    elements = 0
    for ck, mk in wanted.items():
        _file, dtype, shape = scan["keys"][ck]
        rows.append([_text_name(mk, layout), [int(d) for d in shape]])
        dtypes[dtype] += 1
        n = 1
        for d in shape:
            n *= int(d)
        elements += n
    rows.sort()
    digest = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    out: dict[str, Any] = {
        "architecture": layout.architecture,
        "model_type": raw.get("model_type"),
        "text": {
            "num_layers": layout.num_layers,
            "hidden_size": layout.hidden_size,
            "vocab_size": layout.vocab_size,
        },
        "config": _stable(text_raw),
        "weights": {"tensors": len(rows), "elements": elements, "sha256": digest},
        "dtypes": dict(dtypes),
    }
    return out
