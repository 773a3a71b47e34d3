"""A model's real shape, found by inspection on the meta device: the classes the auto
classes pick, where the text decoder layers, embedding, norm and head live, a collapsed
module tree, parameter bytes split into text / vision / other, and checkpoint keys mapped to
module keys with transformers' own load-time renaming rules."""

from __future__ import annotations

import copy
import re
from collections import Counter, OrderedDict
from typing import Any

from remote.errors import UserError
from remote.model_files import one_line

AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForImageTextToText")

# How many names a list in the report shows before it says "and N more": a 27B checkpoint
# with no weights on disk would otherwise print thousands of missing keys.
LIST_LIMIT = 40

# Module names that mark the non-text part of a VLM. Used only to split parameter counts
# into vision vs other once the text backbone has been found by inspection.
VISION_NAME = re.compile(r"vis|image|img|multi_modal|mm_|patch|projector|merger", re.I)


def auto_class_choices(config) -> dict[str, Any]:
    """The class each auto class would pick for this config (None where it has none)."""
    from transformers.models.auto import modeling_auto as ma

    mappings = {"AutoModel": ma.MODEL_MAPPING,
                "AutoModelForCausalLM": ma.MODEL_FOR_CAUSAL_LM_MAPPING,
                "AutoModelForImageTextToText": ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING}
    return {name: m.get(type(config), None) for name, m in mappings.items()}


def checkpoint_class(config, auto: dict[str, Any]):
    """The class the checkpoint was saved from (``architectures``), else the richest auto class.

    The checkpoint's own class is the one its keys match; the auto fallbacks are for configs
    that name a class this transformers lacks.
    """
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type):
            return cls
    for name in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
        if auto.get(name) is not None:
            return auto[name]
    raise UserError(f"no transformers model class for model_type {config.model_type!r}")


def config_dtype(config):
    """The dtype the config declares for its weights (float32 when it declares none)."""
    import torch

    for cfg in (config, config.get_text_config()):
        dt = getattr(cfg, "dtype", None)
        if isinstance(dt, str) and dt not in ("auto",):
            dt = getattr(torch, dt, None)
        if isinstance(dt, torch.dtype):
            return dt
    return torch.float32


def build_on_meta(cls, config, dtype):
    """Instantiate `cls` on the meta device: shapes and structure, no memory, no init."""
    import torch

    with torch.device("meta"):
        return cls._from_config(copy.deepcopy(config), dtype=dtype)


# ---- finding the text decoder by inspection ---------------------------------------------

def find_text_structure(model, vocab_size: int | None) -> dict:
    """Paths of the text decoder layers, embed_tokens, final norm, lm_head and backbone.

    Candidates are ModuleLists whose parent also directly holds an nn.Embedding. Ranked by:
    the parent holds the model's input embedding; that embedding is vocabulary-sized; more
    parameters. Raises UserError when no candidate exists.
    """
    from torch import nn

    names = {id(m): n for n, m in model.named_modules()}
    try:
        input_emb = model.get_input_embeddings()
    except Exception:  # some wrappers do not implement it; inspection still works
        input_emb = None
    candidates = []
    for parent_path, parent in model.named_modules():
        children = list(parent.named_children())
        embs = [(n, c) for n, c in children if isinstance(c, nn.Embedding)]
        if not embs:
            continue
        for name, child in children:
            if not isinstance(child, nn.ModuleList) or len(child) == 0:
                continue
            emb_name, emb = max(embs, key=lambda e: (e[1] is input_emb, e[1].num_embeddings))
            score = (emb is input_emb, emb.num_embeddings == vocab_size,
                     sum(p.numel() for p in child.parameters()), len(child))
            candidates.append((score, parent_path, name, emb_name, parent))
    if not candidates:
        raise UserError("no decoder layer list found: no ModuleList beside an embedding "
                        f"in {type(model).__name__}")
    _, backbone, layers_name, emb_name, parent = max(candidates, key=lambda c: c[0])
    join = (lambda child: f"{backbone}.{child}" if backbone else child)
    norm_name = None
    for name, child in parent.named_children():
        # The final norm is the backbone's own norm child; the last one registered wins
        # (rotary embeddings and layer lists are not norms).
        if "norm" in type(child).__name__.lower() or name in ("norm", "final_layernorm", "ln_f"):
            norm_name = name
    head_path, tied = None, None
    try:
        head = model.get_output_embeddings()
    except Exception:
        head = None
    if head is None or id(head) not in names:
        for path, mod in model.named_modules():
            if (isinstance(mod, nn.Linear) and mod.out_features == vocab_size
                    and not path.startswith(backbone + ".") and path != backbone):
                head = mod
                break
    if head is not None and id(head) in names:
        head_path = names[id(head)]
        emb = parent.get_submodule(emb_name)
        tied = getattr(head, "weight", None) is emb.weight
    return {"backbone": backbone, "backbone_class": type(parent).__name__,
            "layers": join(layers_name), "embed_tokens": join(emb_name),
            "norm": join(norm_name) if norm_name else None,
            "lm_head": head_path, "lm_head_tied": tied}


def layers_path_for(cls, config, dtype, vocab: int | None) -> dict:
    """Layer path a given class would have, or the reason it cannot be built."""
    try:
        m = build_on_meta(cls, config, dtype)
    except Exception as exc:
        return {"class": cls.__name__, "error": one_line(exc)}
    try:
        s = find_text_structure(m, vocab)
        return {"class": cls.__name__, "layers": s["layers"]}
    except UserError as exc:
        return {"class": cls.__name__, "error": str(exc)}


def layer_signature(layer) -> str:
    """A layer's kind from its children: e.g. ``linear_attn:Qwen3_5GatedDeltaNet``.

    Children that differ between layers of one model (the attention or mixer module) are
    what tell full from linear attention, so the signature is the list of its direct
    children's names and classes, shortened to the ones that are not norms.
    """
    parts = [f"{n}:{type(c).__name__}" for n, c in layer.named_children()
             if "norm" not in type(c).__name__.lower()]
    return type(layer).__name__ + "(" + ", ".join(parts) + ")"


def index_ranges(idx: list[int]) -> str:
    out, start, prev = [], None, None
    for i in idx:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}..{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
    return ",".join(out)


def layer_groups(layers) -> list[dict]:
    """Decoder layers grouped by signature: ``[{"kind", "count", "indices"}]``."""
    groups: OrderedDict[str, list[int]] = OrderedDict()
    for i, layer in enumerate(layers):
        groups.setdefault(layer_signature(layer), []).append(i)
    return [{"kind": k, "count": len(v), "indices": index_ranges(v)} for k, v in groups.items()]


def collapsed_tree(module, name: str = "", depth: int = 4) -> dict:
    """The module tree to `depth` levels, ModuleList entries grouped by signature.

    ``layers.0..63`` becomes one node per kind (``0..2,4..6,...``), so a 64-layer model
    prints as a handful of lines.
    """
    from torch import nn

    node: dict[str, Any] = {"name": name, "class": type(module).__name__,
                            "params": sum(p.numel() for p in module.parameters())}
    if depth <= 0:
        return node
    children = []
    if isinstance(module, nn.ModuleList) and len(module) > 0:
        groups: OrderedDict[str, list[int]] = OrderedDict()
        for i, child in enumerate(module):
            groups.setdefault(layer_signature(child), []).append(i)
        for _, idx in groups.items():
            sub = collapsed_tree(module[idx[0]], index_ranges(idx), depth - 1)
            sub["count"] = len(idx)
            children.append(sub)
    else:
        for child_name, child in module.named_children():
            children.append(collapsed_tree(child, child_name, depth - 1))
    if children:
        node["children"] = children
    return node


def parameter_split(model, structure: dict) -> dict:
    """Parameter count and bytes for text backbone (+ lm_head), vision tower and other."""
    backbone = structure["backbone"]
    head = structure["lm_head"]
    out = {k: {"params": 0, "bytes": 0, "modules": set()} for k in ("text", "vision", "other")}
    for path, p in model.named_parameters():
        in_text = (not backbone or path.startswith(backbone + ".")) or (
            head is not None and path.startswith(head + "."))
        if in_text:
            group = "text"
            top = backbone if (not backbone or path.startswith(backbone + ".")) else head
        else:
            top = _top_outside(path, backbone)
            group = "vision" if VISION_NAME.search(top) else "other"
        out[group]["params"] += p.numel()
        out[group]["bytes"] += p.numel() * p.element_size()
        out[group]["modules"].add(top or "(root)")
    for v in out.values():
        v["modules"] = sorted(v["modules"])
    out["total"] = {"params": sum(out[k]["params"] for k in ("text", "vision", "other")),
                    "bytes": sum(out[k]["bytes"] for k in ("text", "vision", "other"))}
    return out


def _top_outside(path: str, backbone: str) -> str:
    """The first component of `path` that leaves the backbone's ancestor chain."""
    parts, anc = path.split("."), backbone.split(".") if backbone else []
    i = 0
    while i < len(anc) and i < len(parts) and parts[i] == anc[i]:
        i += 1
    return ".".join(parts[: i + 1])


# ---- checkpoint keys vs module keys -----------------------------------------------------

def map_checkpoint_keys(model, ckpt_keys: list[str]) -> tuple[dict[str, str], set[str], str]:
    """Map each checkpoint key to the module key transformers would load it into.

    Uses transformers' own renaming rules and base-model-prefix handling, as
    ``from_pretrained`` does. Returns (mapping, keys that need a tensor conversion beyond a
    rename, how the mapping was done).
    """
    meta_sd = model.state_dict()
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                     rename_source_key)
        conversions = get_model_conversion_mapping(model)
        renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        converters = [c for c in conversions if isinstance(c, WeightConverter)]
        method = "transformers conversion mapping"
    except Exception:  # older/newer transformers without this API: prefix handling only
        renamings, converters = [], []
        method = "base-model prefix only"

        def rename_source_key(key, _r, _c, prefix, sd):
            if prefix and key.startswith(prefix + ".") and key[len(prefix) + 1:] in sd:
                return key[len(prefix) + 1:], None
            if prefix and f"{prefix}.{key}" in sd:
                return f"{prefix}.{key}", None
            return key, None
    mapping: dict[str, str] = {}
    converted: set[str] = set()
    prefix = getattr(model, "base_model_prefix", "")
    for key in sorted(ckpt_keys):
        new, pattern = rename_source_key(key, renamings, converters, prefix, meta_sd)
        if new not in meta_sd and key in meta_sd:
            new, pattern = key, None
        mapping[key] = new
        if pattern is not None:
            converted.add(key)
    return mapping, converted, method


def key_prefix(key: str) -> str:
    """A key's family: the dotted path before the first layer index, at most 3 parts.

    ``model.language_model.layers.7.mlp.up_proj.weight`` -> ``model.language_model.layers``.
    """
    parts = key.split(".")
    if len(parts) > 1:
        parts = parts[:-1]  # the leaf (weight, bias)
    out = []
    for p in parts:
        if p.isdigit():
            break
        out.append(p)
    return ".".join(out[:3]) or key


def limited(items, limit: int = LIST_LIMIT) -> dict:
    items = sorted(items)
    return {"count": len(items), "items": items[:limit]}


def key_report(model, scan: dict, structure: dict) -> tuple[dict, dict[str, str], set[str]]:
    """Prefixes, remapped prefixes, missing and unexpected keys; both path forms."""
    ckpt_keys = list(scan["keys"])
    mapping, converted, method = map_checkpoint_keys(model, ckpt_keys)
    meta_keys = set(model.state_dict())
    loaded = {v for v in mapping.values() if v in meta_keys}
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    missing = set()
    for key in meta_keys - loaded:
        # A tied weight (lm_head tied to embed_tokens) is filled from its source on load.
        if key in tied and tied[key] in loaded:
            continue
        missing.add(key)
    ignore_missing = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    missing = {k for k in missing if not any(p.search(k) for p in ignore_missing)}
    ignore_unexp = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])]
    unexpected = {k for k, v in mapping.items()
                  if v not in meta_keys and not any(p.search(k) for p in ignore_unexp)}
    remapped = Counter((key_prefix(k), key_prefix(v)) for k, v in mapping.items()
                       if k != v and v in meta_keys)
    text_missing = {k for k in missing if _under(k, structure["backbone"]) or
                    (structure["lm_head"] and _under(k, structure["lm_head"]))}

    def ckpt_form(module_path: str | None) -> str | None:
        if module_path is None:
            return None
        for ck, mk in mapping.items():
            if mk.startswith(module_path + "."):
                return ck[: len(ck) - (len(mk) - len(module_path))]
        return None

    forms = {name: {"module": structure[name], "checkpoint": ckpt_form(structure[name])}
             for name in ("layers", "embed_tokens", "norm", "lm_head", "backbone")}
    report = {
        "mapping_method": method,
        "checkpoint_prefixes": dict(sorted(Counter(key_prefix(k) for k in ckpt_keys).items())),
        "module_prefixes": dict(sorted(Counter(key_prefix(k) for k in meta_keys).items())),
        "remapped_prefixes": [{"checkpoint": a, "module": b, "keys": n}
                              for (a, b), n in sorted(remapped.items())],
        "paths": forms,
        "missing": limited(missing),
        "missing_text": limited(text_missing),
        "unexpected": limited(unexpected),
        "needs_conversion": limited(converted),
        "complete": not missing and not unexpected and bool(ckpt_keys),
        "text_complete": not text_missing and bool(ckpt_keys),
    }
    return report, mapping, converted


def _under(key: str, path: str) -> bool:
    return not path or key == path or key.startswith(path + ".")
