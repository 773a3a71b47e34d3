"""Which model a target folder holds, as a few comparable facts (for ``parity``: are two
hosts' targets copies of one checkpoint?).

Built from what the model reader already found (`remote.model.layout.describe` and the
shard scan of `remote.model.load.plan_text`): nothing more is read. The text part only,
since that is what a capture computes: a VLM and its text-only export have one identity.

- ``architecture``, ``model_type``, ``text`` (layers, hidden size, vocabulary): the built
  class, the config's type and the text part's size, to show (a VLM and its text-only
  export are built by two classes);
- ``config``: the text config without what copies of one checkpoint may differ in (names,
  versions, storage dtype, token ids);
- ``weights``: the text weights' count, elements and one sha256 over their names (relative
  to the text backbone) and shapes, sorted; their storage dtypes apart (a bf16 copy of an
  fp32 checkpoint is the same checkpoint, and parity measures what that costs).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

# Config keys two copies of one checkpoint may differ in without being other models.
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
    """A text weight's module key relative to the text part (``backbone.<rest>``,
    ``head.<rest>``), however deep its class nests the text model."""
    if layout.head_path and (key == layout.head_path or key.startswith(layout.head_path + ".")):
        return "head" + key[len(layout.head_path) :]
    if layout.backbone_path:
        return "backbone" + key[len(layout.backbone_path) :]
    return "backbone." + key


def target_identity(described, scan: dict, wanted: dict[str, str]) -> dict:
    """The identity of the described target (see the module docstring). `scan`: its shard
    scan; `wanted`: checkpoint key -> module key of its text weights, both as
    `remote.model.load.plan_text` answers them."""
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
