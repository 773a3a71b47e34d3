"""``probe``: what a model really is on this host, as one JSON document (``dflash.probe/1``).

Default mode reads ``config.json`` and the safetensors index/headers only and builds the
model on the meta device, so no weight is read and a 27B config answers in seconds. The text
decoder is found by inspecting the module tree, not from a table of architectures: the
candidate layer lists are the ``ModuleList`` children of modules that also hold an
``nn.Embedding``; the one beside the model's input embedding (vocabulary-sized) wins, largest
first. Checkpoint keys are mapped to module keys with transformers' own load-time renaming
rules (``get_model_conversion_mapping``), so a checkpoint storing
``language_model.model.layers.*`` is matched to the module at ``model.language_model.layers``
and both forms are reported.

``--drafter`` checks a z-lab DFlash drafter against the target; ``--load`` loads the text
backbone only (never the vision tower), runs a short forward and checks the hidden states
against forward hooks on the reported layer path.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
import struct
import sys
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.facts import disk_free, meminfo

SCHEMA = "dflash.probe/1"
INDEX_NAME = "model.safetensors.index.json"
AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForImageTextToText")
# How many names a list in the report shows before it says "and N more": a 27B checkpoint
# with no weights on disk would otherwise print thousands of missing keys.
LIST_LIMIT = 40
# Module names that mark the non-text part of a VLM. Used only to split parameter counts
# into vision vs other once the text backbone has been found by inspection.
VISION_NAME = re.compile(r"vis|image|img|multi_modal|mm_|patch|projector|merger", re.I)
DRAFTER_KEY_PREFIXES = ("module.", "_orig_mod.", "draft_model.", "model.")


# ---- reading the folder -----------------------------------------------------------------

def read_json(path: Path, what: str) -> dict:
    """Parse a JSON file or raise a one-line UserError naming it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} is not a JSON object")
    return data


def read_model_config(folder: Path, what: str = "model") -> dict:
    """The raw ``config.json`` of a model folder; a missing folder or file is a UserError."""
    if not folder.exists():
        raise UserError(f"{what} folder not found: {folder}")
    if not folder.is_dir():
        raise UserError(f"{what} path is not a folder: {folder}")
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise UserError(f"no config.json in {what} folder {folder}")
    return read_json(cfg, "config")


def build_config(folder: Path, raw: dict):
    """A transformers config from the raw dict; an unknown model_type says what to upgrade."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = raw.get("model_type")
    if not model_type:
        raise UserError(f"config.json in {folder} has no model_type")
    if model_type not in CONFIG_MAPPING:
        saved = raw.get("transformers_version")
        have = transformers.__version__
        if saved and _version_tuple(saved) > _version_tuple(have):
            hint = f"it was saved by transformers {saved}: upgrade to >= {saved}"
        else:
            hint = "upgrade transformers (pip install -U transformers) or check the model_type"
        raise UserError(f"model_type {model_type!r} in {folder}/config.json is unknown to "
                        f"transformers {have} on this host; {hint}")
    try:
        return AutoConfig.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many types for a bad config
        raise UserError(f"transformers cannot read {folder}/config.json: "
                        f"{_one_line(exc)}") from None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_safetensors_header(path: Path) -> tuple[dict, int, int]:
    """(header, data start, file size) of a safetensors file, reading only its header.

    A file too short to hold the header it announces is a UserError: nothing in it can be
    trusted, not even its key list.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise UserError(f"shard {path} is truncated: {size} bytes, no safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise UserError(f"shard {path} is truncated or not safetensors: header says "
                                f"{n} bytes, file has {size}")
            header = json.loads(fh.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"shard {path} has an unreadable safetensors header") from None
    except OSError as exc:
        raise UserError(f"cannot read shard {path}: {exc.strerror or exc}") from None
    return header, 8 + n, size


def scan_checkpoint(folder: Path) -> dict:
    """Shard files, their keys, dtypes and completeness, from headers only.

    Returns ``{"files", "index", "keys": {key: (file, dtype, shape)}, "missing_shards",
    "truncated_shards", "bytes_on_disk"}``. A shard listed by the index but absent, or shorter
    than its header's last data offset, is listed (not raised): the probe's job is to say so.
    """
    index_path = folder / INDEX_NAME
    index = None
    expected_files: list[str]
    if index_path.exists():
        index = read_json(index_path, "safetensors index")
        wm = index.get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise UserError(f"safetensors index {index_path} has no usable weight_map")
        expected_files = sorted(set(wm.values()))
    else:
        expected_files = sorted(p.name for p in folder.glob("*.safetensors"))
    keys: dict[str, tuple[str, str, list[int]]] = {}
    missing, truncated, on_disk = [], [], 0
    for name in expected_files:
        path = folder / name
        if not path.is_file():
            missing.append(name)
            continue
        header, start, size = read_safetensors_header(path)
        on_disk += size
        end = 0
        for key, info in header.items():
            if key == "__metadata__":
                continue
            end = max(end, int(info["data_offsets"][1]))
            keys[key] = (name, info["dtype"], list(info["shape"]))
        if start + end > size:
            truncated.append({"file": name, "size": size, "expected": start + end})
    if index is not None:
        # Keys of a missing shard are still known from the index.
        for key, name in index["weight_map"].items():
            keys.setdefault(key, (name, "?", []))
    other = sorted(p.name for p in folder.iterdir()
                   if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    return {"files": expected_files, "index": INDEX_NAME if index is not None else None,
            "keys": keys, "missing_shards": missing, "truncated_shards": truncated,
            "bytes_on_disk": on_disk, "other_weight_files": other}


# ---- building on the meta device --------------------------------------------------------

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
        return {"class": cls.__name__, "error": _one_line(exc)}
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


def _ranges(idx: list[int]) -> str:
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
    return [{"kind": k, "count": len(v), "indices": _ranges(v)} for k, v in groups.items()]


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
            sub = collapsed_tree(module[idx[0]], _ranges(idx), depth - 1)
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


def _limited(items, limit: int = LIST_LIMIT) -> dict:
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
        "missing": _limited(missing),
        "missing_text": _limited(text_missing),
        "unexpected": _limited(unexpected),
        "needs_conversion": _limited(converted),
        "complete": not missing and not unexpected and bool(ckpt_keys),
        "text_complete": not text_missing and bool(ckpt_keys),
    }
    return report, mapping, converted


def _under(key: str, path: str) -> bool:
    return not path or key == path or key.startswith(path + ".")


# ---- the host ---------------------------------------------------------------------------

def kernel_status(name: str) -> dict:
    """Whether an optional fast-kernel package imports here, and why not when it does not."""
    try:
        mod = importlib.import_module(name)
        return {"importable": True, "version": getattr(mod, "__version__", None)}
    except Exception as exc:  # ImportError, or a CUDA-less build raising at import time
        return {"importable": False, "reason": _one_line(exc)}


def host_report(folder: Path, text_bytes: int) -> dict:
    """Fast kernels, free RAM against what a text-only eval needs, free disk."""
    import torch
    import transformers

    mem = meminfo()
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "kernels": {"fla": kernel_status("fla"), "causal_conv1d": kernel_status("causal_conv1d")},
        "ram_total": mem["total"],
        "ram_available": mem["available"],
        "text_only_bytes_needed": text_bytes,
        "fits_in_ram": mem["available"] >= text_bytes if mem["available"] else None,
        "disk_free": disk_free(str(folder)),
    }


# ---- drafter --------------------------------------------------------------------------

def default_target_layer_ids(n: int, k: int) -> list[int]:
    """z-lab's default layer choice for `k` drafter layers over `n` target layers."""
    if k == 1:
        return [n // 2]
    return [round(1 + i * (n - 4) / (k - 1)) for i in range(k)]


def rope_summary(cfg: dict) -> dict:
    """rope theta, type and scaling factor, whichever spelling the config uses."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if isinstance(params, dict) and "rope_theta" not in params and params:
        # Per-layer-type rope parameters (Gemma3): compare the full-attention entry.
        params = params.get("full_attention", next(iter(params.values())))
    return {
        "theta": cfg.get("rope_theta", params.get("rope_theta") if isinstance(params, dict) else None),
        "type": (params.get("rope_type") if isinstance(params, dict) else None)
                or scaling.get("rope_type") or scaling.get("type") or "default",
        "factor": (params.get("factor") if isinstance(params, dict) else None) or scaling.get("factor"),
    }


def check_drafter(folder: Path, target: dict, target_text_raw: dict) -> dict:
    """Check a z-lab DFlash drafter against the target; every problem and warning one line.

    `target` carries the probe's ``num_layers``, ``hidden_size``, ``vocab_size``.
    """
    raw = read_model_config(folder, "drafter")
    problems: list[str] = []
    warnings: list[str] = []
    n, hidden, vocab = target["num_layers"], target["hidden_size"], target["vocab_size"]
    d_hidden = raw.get("hidden_size")
    d_layers = raw.get("num_hidden_layers")
    dcfg = raw.get("dflash_config") or {}
    ids = dcfg.get("target_layer_ids", raw.get("target_layer_ids"))
    ids_source = "config"
    if ids is None:
        if not isinstance(d_layers, int):
            problems.append("drafter config has neither target_layer_ids nor num_hidden_layers")
            ids = []
        else:
            ids = default_target_layer_ids(n, d_layers)
            ids_source = "default"
            warnings.append(f"no target_layer_ids in the drafter config: z-lab default {ids} assumed")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        problems.append(f"target_layer_ids must be a list of integers, got {ids!r}")
        ids = []
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        problems.append(f"target_layer_ids {bad} out of range for a {n}-layer target (0..{n - 1})")
    if len(set(ids)) != len(ids):
        problems.append(f"target_layer_ids {ids} repeat a layer")
    ntl = raw.get("num_target_layers")
    if ntl is not None and ntl != n:
        problems.append(f"num_target_layers {ntl} != target's {n} decoder layers")
    if d_hidden != hidden:
        problems.append(f"drafter hidden_size {d_hidden} != target hidden_size {hidden} "
                        "(the drafter uses the target's embed_tokens and lm_head)")
    d_vocab = raw.get("vocab_size")
    if d_vocab is not None and d_vocab != vocab:
        problems.append(f"drafter vocab_size {d_vocab} != target vocab_size {vocab}")
    mask = dcfg.get("mask_token_id", raw.get("mask_token_id"))
    if mask is None:
        problems.append("no mask_token_id in the drafter's dflash_config")
    elif not isinstance(mask, int) or not 0 <= mask < vocab:
        problems.append(f"mask_token_id {mask!r} is outside the target vocabulary (0..{vocab - 1})")
    block = raw.get("block_size")
    if not isinstance(block, int) or block < 2:
        problems.append(f"block_size must be an integer >= 2, got {block!r}")
    # Weights: headers only.
    weights: dict[str, Any] = {}
    try:
        scan = scan_checkpoint(folder)
        keys = scan["keys"]
    except UserError as exc:
        problems.append(str(exc))
        scan, keys = None, {}
    stripped = {}
    for k, v in keys.items():
        s = k
        changed = True
        while changed:
            changed = False
            for p in DRAFTER_KEY_PREFIXES:
                if s.startswith(p):
                    s, changed = s[len(p):], True
        stripped[s] = v
    prefixes = sorted({key_prefix(k) for k in keys} - {key_prefix(k) for k in stripped})
    if prefixes:
        warnings.append(f"weight keys carry training prefixes ({', '.join(prefixes)}): "
                        "stripped for this check")
    if scan is not None and not keys:
        problems.append(f"no safetensors weights in drafter folder {folder}")
    elif keys:
        fc = stripped.get("fc.weight")
        if fc is None:
            problems.append("drafter weights have no fc.weight")
        elif fc[2]:
            out_f, in_f = fc[2][0], fc[2][1]
            weights["fc"] = [out_f, in_f]
            if in_f != len(ids) * hidden:
                problems.append(f"fc input width {in_f} != len(target_layer_ids) {len(ids)} x "
                                f"target hidden {hidden} = {len(ids) * hidden}")
            if out_f != d_hidden:
                problems.append(f"fc output width {out_f} != drafter hidden_size {d_hidden}")
        for name in ("hidden_norm.weight", "norm.weight"):
            if name not in stripped:
                problems.append(f"drafter weights have no {name}")
        layer_ids = sorted({int(m.group(1)) for k in stripped
                            if (m := re.match(r"layers\.(\d+)\.", k))})
        weights["layers"] = len(layer_ids)
        if isinstance(d_layers, int) and layer_ids != list(range(d_layers)):
            problems.append(f"drafter weights hold layers {_ranges(layer_ids) or 'none'}, "
                            f"config says num_hidden_layers {d_layers}")
        if any(k.startswith(("embed_tokens", "lm_head")) for k in stripped):
            warnings.append("drafter checkpoint carries its own embed_tokens/lm_head; "
                            "DFlash uses the target's")
        if scan is not None:
            for t in scan["truncated_shards"]:
                problems.append(f"drafter shard {t['file']} is truncated ({t['size']} of "
                                f"{t['expected']} bytes)")
            for m in scan["missing_shards"]:
                problems.append(f"drafter shard {m} listed in the index is missing")
    # Warnings about settings that run but give different numbers.
    dr, tr = rope_summary(raw), rope_summary(target_text_raw)
    for field in ("theta", "type", "factor"):
        if dr[field] != tr[field] and not (field == "factor" and dr[field] is None and tr[field] is None):
            warnings.append(f"rope {field} differs: drafter {dr[field]!r}, target {tr[field]!r}")
    d_max, t_max = raw.get("max_position_embeddings"), target_text_raw.get("max_position_embeddings")
    if isinstance(d_max, int) and isinstance(t_max, int) and d_max < t_max:
        warnings.append(f"drafter max_position_embeddings {d_max} < target's {t_max}: "
                        "long contexts run past the drafter's trained positions")
    types = raw.get("layer_types") or []
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding:
        window = raw.get("sliding_window")
        how = (f"window {window}" if window else "but no sliding_window is set")
        warnings.append(f"drafter layers {_ranges(sliding)} are sliding_attention ({how}): an "
                        "eval that ignores sliding windows runs them as full attention")
    if ids and not bad and ids_source == "config" and isinstance(d_layers, int) and d_layers > 0:
        default = default_target_layer_ids(n, len(ids))
        if ids != default and ([i - 1 for i in ids] == default or [i + 1 for i in ids] == default):
            warnings.append(f"target_layer_ids {ids} look shifted by one from the default "
                            f"{default} (0- vs 1-based, or hidden_states index vs layer index?)")
    if ids and n - 1 in ids:
        warnings.append(f"target_layer_ids include the last layer {n - 1}: hidden_states[{n}] "
                        "is final-normed in transformers 5.x, take that layer's raw output with a hook")
    if bad and max(bad) == n and min(ids) >= 1:
        warnings.append("target_layer_ids look 1-based (the largest equals the layer count)")
    return {
        "path": str(folder),
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "block_size": block,
        "num_layers": d_layers,
        "hidden_size": d_hidden,
        "vocab_size": d_vocab,
        "mask_token_id": mask,
        "target_layer_ids": ids,
        "target_layer_ids_source": ids_source,
        "hidden_states_indices": [i + 1 for i in ids],
        "weights": weights,
        "rope": dr,
    }


# ---- --load -----------------------------------------------------------------------------

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
                            f"from {folder}: {_one_line(exc)}") from None
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
        raise UserError(f"--load: forward of {type(model).__name__} failed: {_one_line(exc)}") from None
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
        "missing_after_load": _limited(missing),
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


# ---- the command ------------------------------------------------------------------------

def _head_counts(text_cfg) -> dict:
    return {k: v for k, v in sorted(vars(text_cfg).items())
            if isinstance(v, int) and not isinstance(v, bool)
            and ("heads" in k or k.endswith("head_dim") or k == "head_dim")}


def probe(model: str, drafter: str | None = None, load: bool = False, depth: int = 4) -> dict:
    """The whole probe as a dict (schema ``dflash.probe/1``). See the module docstring."""
    t0 = time.monotonic()
    folder = Path(os.path.expanduser(model)).resolve()
    raw = read_model_config(folder)
    config = build_config(folder, raw)
    scan = scan_checkpoint(folder)
    import torch  # noqa: F401  (after the cheap checks: a bad path fails in milliseconds)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

    text_cfg = config.get_text_config()
    vocab = getattr(text_cfg, "vocab_size", None)
    dtype = config_dtype(config)
    auto = auto_class_choices(config)
    cls = checkpoint_class(config, auto)
    try:
        meta_model = build_on_meta(cls, config, dtype)
    except Exception as exc:
        raise UserError(f"cannot build {cls.__name__} from {folder}/config.json on the meta "
                        f"device: {_one_line(exc)}") from None
    structure = find_text_structure(meta_model, vocab)
    layers = meta_model.get_submodule(structure["layers"])
    num_layers = len(layers)
    hidden = getattr(text_cfg, "hidden_size", None)
    auto_report = {}
    for name, acls in auto.items():
        if acls is None:
            auto_report[name] = None
        elif acls is cls:
            auto_report[name] = {"class": cls.__name__, "layers": structure["layers"]}
        else:
            auto_report[name] = layers_path_for(acls, config, dtype, vocab)
    split = parameter_split(meta_model, structure)
    keys, mapping, converted = key_report(meta_model, scan, structure)
    cfg_types = getattr(text_cfg, "layer_types", None)
    ckpt_dtypes = Counter(v[1] for v in scan["keys"].values() if v[1] != "?")
    is_vlm = structure["backbone"] != "" and split["vision"]["params"] > 0
    text_raw = raw.get("text_config") or raw
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "model_path": str(folder),
        "model_type": config.model_type,
        "text_model_type": getattr(text_cfg, "model_type", None),
        "architectures": list(getattr(config, "architectures", None) or []),
        "is_vlm": is_vlm,
        "built_class": cls.__name__,
        "auto_classes": auto_report,
        "text": {
            **structure,
            "num_layers": num_layers,
            "config_num_hidden_layers": getattr(text_cfg, "num_hidden_layers", None),
            "hidden_size": hidden,
            "vocab_size": vocab,
            "heads": _head_counts(text_cfg),
            "intermediate_size": getattr(text_cfg, "intermediate_size", None),
            "max_position_embeddings": getattr(text_cfg, "max_position_embeddings", None),
            "rope": rope_summary(text_raw),
            "layer_types_config": dict(Counter(cfg_types)) if cfg_types else None,
            "layer_kinds": layer_groups(layers),
        },
        "dtype": str(dtype).replace("torch.", ""),
        "parameters": split,
        "checkpoint": {
            "files": scan["files"],
            "index": scan["index"],
            "tensors": len(scan["keys"]),
            "dtypes": dict(ckpt_dtypes),
            "bytes_on_disk": scan["bytes_on_disk"],
            "missing_shards": scan["missing_shards"],
            "truncated_shards": scan["truncated_shards"],
            "other_weight_files": scan["other_weight_files"],
            "shards_complete": not scan["missing_shards"] and not scan["truncated_shards"],
        },
        "keys": keys,
        "host": host_report(folder, split["text"]["bytes"]),
        "tree": collapsed_tree(meta_model, "", depth),
        "drafter": None,
        "load": None,
    }
    target = {"num_layers": num_layers, "hidden_size": hidden, "vocab_size": vocab}
    if drafter:
        report["drafter"] = check_drafter(Path(os.path.expanduser(drafter)).resolve(),
                                          target, text_raw)
    if load:
        if not scan["keys"]:
            raise UserError(f"cannot --load {folder}: no safetensors weights in it")
        report["load"] = load_and_verify(folder, meta_model, structure, scan, mapping,
                                         converted, dtype, num_layers, hidden, vocab)
    report["probe_seconds"] = round(time.monotonic() - t0, 3)
    return report


def run(args) -> int:
    print(json.dumps(probe(args.model, args.drafter, args.load, args.depth)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("probe", help="print a model's real structure as JSON (dflash.probe/1)")
    p.add_argument("--model", required=True, help="model folder (config.json + safetensors)")
    p.add_argument("--drafter", help="DFlash drafter folder to check against the model")
    p.add_argument("--load", action="store_true",
                   help="load the text backbone and verify hidden states with a short forward")
    p.add_argument("--depth", type=int, default=4, help="depth of the module tree in the report")
    p.set_defaults(func=run)
