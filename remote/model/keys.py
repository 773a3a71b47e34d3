"""Checkpoint keys <-> module keys through transformers' own load-time conversion mapping,
in its key order, so the report and loader never disagree with it (docs/probe.md)."""

from __future__ import annotations

import re
from collections import Counter

from remote.model.layout import TextLayout

# A big checkpoint with no weights on disk would otherwise list every missing key.
LIST_LIMIT = 40


def conversion_mapping(model) -> list:
    """The model's weight transforms, exactly as ``from_pretrained`` builds them."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    return get_model_conversion_mapping(model)


def map_checkpoint_keys(
    model, ckpt_keys, meta_sd: dict | None = None
) -> tuple[dict[str, str], set[str]]:
    """(checkpoint key -> module key transformers loads it into, keys needing a conversion
    beyond a rename); in transformers' order, as some renamings decide on the first key."""
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    meta_sd = model.state_dict() if meta_sd is None else meta_sd
    transforms = conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = getattr(model, "base_model_prefix", "")
    mapping: dict[str, str] = {}
    converted: set[str] = set()
    for key in sorted(ckpt_keys, key=dot_natural_key):
        new, pattern = rename_source_key(key, renamings, converters, prefix, meta_sd)
        if new not in meta_sd and key in meta_sd:
            # As transformers does: a key that needed no rename, only a prefix.
            new, pattern = rename_source_key(key, [], [], prefix, meta_sd)
        mapping[key] = new
        if pattern is not None:
            converted.add(key)
    return mapping, converted


def key_prefix(key: str) -> str:
    """A key's family: the dotted path before the first layer index, at most 3 parts."""
    parts = key.split(".")
    if len(parts) > 1:
        parts = parts[:-1]
    out = []
    for p in parts:
        if p.isdigit():
            break
        out.append(p)
    return ".".join(out[:3]) or key


def limited(items, limit: int = LIST_LIMIT) -> dict:
    items = sorted(items)
    return {"count": len(items), "items": items[:limit]}


def missing_keys(model, mapping: dict[str, str], meta_keys: set[str]) -> set[str]:
    """Module keys no checkpoint key fills (tied copies and keys the model ignores excluded)."""
    loaded = {v for v in mapping.values() if v in meta_keys}
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    ignore = [
        re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
    ]
    return {
        k
        for k in meta_keys - loaded
        if not (k in tied and tied[k] in loaded) and not any(p.search(k) for p in ignore)
    }


def key_report(model, scan: dict, layout: TextLayout) -> tuple[dict, dict[str, str], set[str]]:
    """Prefixes, remapped prefixes, missing and unexpected keys; both path forms."""
    ckpt_keys = list(scan["keys"])
    meta_keys = set(model.state_dict())
    mapping, converted = map_checkpoint_keys(model, ckpt_keys)
    missing = missing_keys(model, mapping, meta_keys)
    ignore_unexp = [
        re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    ]
    unexpected = {
        k
        for k, v in mapping.items()
        if v not in meta_keys and not any(p.search(k) for p in ignore_unexp)
    }
    remapped = Counter(
        (key_prefix(k), key_prefix(v)) for k, v in mapping.items() if k != v and v in meta_keys
    )
    text_missing = {k for k in missing if layout.in_text(k)}
    structure = layout.structure()

    def ckpt_form(module_path: str | None) -> str | None:
        if module_path is None:
            return None
        for ck, mk in mapping.items():
            if mk.startswith(module_path + ".") and ck not in converted:
                return ck[: len(ck) - (len(mk) - len(module_path))]
        return None

    forms = {
        name: {"module": structure[name], "checkpoint": ckpt_form(structure[name])}
        for name in ("layers", "embed_tokens", "norm", "lm_head", "backbone")
    }
    whole = scan.get("complete", True)
    report = {
        "mapping_method": "transformers conversion mapping",
        "checkpoint_prefixes": dict(sorted(Counter(key_prefix(k) for k in ckpt_keys).items())),
        "module_prefixes": dict(sorted(Counter(key_prefix(k) for k in meta_keys).items())),
        "remapped_prefixes": [
            {"checkpoint": a, "module": b, "keys": n} for (a, b), n in sorted(remapped.items())
        ],
        "paths": forms,
        "missing": limited(missing),
        "missing_text": limited(text_missing),
        "unexpected": limited(unexpected),
        "needs_conversion": limited(converted),
        # A key listed in a header is not a tensor on disk: a truncated shard is incomplete.
        "complete": whole and not missing and not unexpected and bool(ckpt_keys),
        "text_complete": whole and not text_missing and bool(ckpt_keys),
    }
    return report, mapping, converted
