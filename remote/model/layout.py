"""A model's shape, found by inspecting its module tree on the meta device, with no table
of architectures: its class, its text part and what is vision (docs/probe.md)."""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.model.files import build_config, one_line, read_model_config
from remote.model.quiet import transformers_quiet

AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForImageTextToText")

# Splits the parameters outside the text part for reports only; the tree decides what is text.
VISION_NAME = re.compile(r"vis|image|img|multi_modal|mm_|patch|projector|merger|audio", re.I)


@dataclass
class TextLayout:
    """Where the text part of a model lives (module paths in the built class)."""

    architecture: str  # the built class
    backbone_path: str  # "" when the model itself is the backbone
    backbone_class: str
    layers_path: str
    embed_path: str
    norm_path: str | None
    head_path: str | None
    tied_head: bool | None
    num_layers: int
    hidden_size: int
    vocab_size: int
    layer_types: list[str] | None

    def structure(self) -> dict:
        """The probe report's ``text`` paths, in its historical key names."""
        return {
            "backbone": self.backbone_path,
            "backbone_class": self.backbone_class,
            "layers": self.layers_path,
            "embed_tokens": self.embed_path,
            "norm": self.norm_path,
            "lm_head": self.head_path,
            "lm_head_tied": self.tied_head,
        }

    def as_dict(self) -> dict:
        return asdict(self)

    def in_text(self, key: str) -> bool:
        """Whether a module key belongs to the text part."""
        return _under(key, self.backbone_path) or (
            self.head_path is not None and _under(key, self.head_path)
        )

    def in_ends(self, key: str) -> bool:
        """Whether a module key belongs to the embedding or head, what a drafter borrows."""
        return _under(key, self.embed_path) or (
            self.head_path is not None and _under(key, self.head_path)
        )


def _under(key: str, path: str) -> bool:
    return not path or key == path or key.startswith(path + ".")


def auto_class_choices(config) -> dict[str, Any]:
    """The class each auto class would pick for this config (None where it has none)."""
    from transformers.models.auto import modeling_auto as ma

    mappings = {
        "AutoModel": ma.MODEL_MAPPING,
        "AutoModelForCausalLM": ma.MODEL_FOR_CAUSAL_LM_MAPPING,
        "AutoModelForImageTextToText": ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    }
    return {name: m.get(type(config), None) for name, m in mappings.items()}


def checkpoint_class(config, auto: dict[str, Any] | None = None):
    """The class the checkpoint was saved from, whose keys it matches, else (a class this
    transformers lacks) the richest auto class."""
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type):
            return cls
    auto = auto_class_choices(config) if auto is None else auto
    for name in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
        if auto.get(name) is not None:
            return auto[name]
    raise UserError(f"no transformers model class for model_type {config.model_type!r}")


def config_dtype(config):
    """The dtype the config declares for its weights, else float32."""
    import torch

    for cfg in (config, config.get_text_config()):
        dt = getattr(cfg, "dtype", None)
        if isinstance(dt, str) and dt not in ("auto",):
            dt = getattr(torch, dt, None)
        if isinstance(dt, torch.dtype):
            return dt
    return torch.float32


def build_on_meta(cls, config, dtype):
    """Instantiate `cls` on the meta device; uninitialised, so ``_init_weights`` can later
    fill the buffers of the part we load."""
    import torch

    with torch.device("meta"):
        return cls._from_config(copy.deepcopy(config), dtype=dtype)


def find_text(model, vocab_size: int | None) -> TextLayout:
    """Find the text decoder: the ModuleList beside the input (else a vocabulary-sized)
    embedding, the largest; the head is the output embedding or a vocabulary-wide Linear."""
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
        emb_name, emb = max(embs, key=lambda e: (e[1] is input_emb, e[1].num_embeddings))
        for name, child in children:
            if not isinstance(child, nn.ModuleList) or len(child) == 0:
                continue
            score = (
                emb is input_emb,
                emb.num_embeddings == vocab_size,
                sum(p.numel() for p in child.parameters()),
                len(child),
            )
            candidates.append((score, parent_path, name, emb_name, parent))
    if not candidates:
        raise UserError(
            "no decoder layer list found: no ModuleList beside an embedding "
            f"in {type(model).__name__}"
        )
    _, backbone, layers_name, emb_name, parent = max(candidates, key=lambda c: c[0])

    def join(child: str) -> str:
        return f"{backbone}.{child}" if backbone else child

    norm_name = None
    for name, child in parent.named_children():
        # The last norm child registered is the final norm.
        if "norm" in type(child).__name__.lower() or name in ("norm", "final_layernorm", "ln_f"):
            norm_name = name
    try:
        head = model.get_output_embeddings()
    except Exception:
        head = None
    if head is None or id(head) not in names:
        head = next(
            (
                m
                for p, m in model.named_modules()
                if isinstance(m, nn.Linear)
                and m.out_features == vocab_size
                and not _under(p, backbone)
            ),
            None,
        )
    emb = parent.get_submodule(emb_name)
    head_path = names[id(head)] if head is not None and id(head) in names else None
    text_cfg = getattr(parent, "config", None) or model.config.get_text_config()
    layers = parent.get_submodule(layers_name)
    return TextLayout(
        architecture=type(model).__name__,
        backbone_path=backbone,
        backbone_class=type(parent).__name__,
        layers_path=join(layers_name),
        embed_path=join(emb_name),
        norm_path=join(norm_name) if norm_name else None,
        head_path=head_path,
        tied_head=(getattr(head, "weight", None) is emb.weight) if head_path else None,
        num_layers=len(layers),
        hidden_size=int(emb.weight.shape[1]),
        vocab_size=int(emb.weight.shape[0]),
        layer_types=list(getattr(text_cfg, "layer_types", None) or []) or None,
    )


def layers_path_for(cls, config, dtype, vocab: int | None) -> dict:
    """Layer path a given class would have, or why it cannot be built."""
    try:
        m = build_on_meta(cls, config, dtype)
    except Exception as exc:
        return {"class": cls.__name__, "error": one_line(exc)}
    try:
        return {"class": cls.__name__, "layers": find_text(m, vocab).layers_path}
    except UserError as exc:
        return {"class": cls.__name__, "error": str(exc)}


@dataclass
class Described:
    """A model folder described without reading a weight."""

    folder: Path
    raw: dict
    config: Any
    cls: type
    dtype: Any  # what the meta model is built in
    model: Any  # on the meta device
    layout: TextLayout


def describe(folder: str | Path, dtype=None) -> Described:
    """Config, class, meta model (in `dtype`, else the config's) and text layout."""
    folder = Path(folder)
    raw = read_model_config(folder)
    config = build_config(folder, raw)
    with transformers_quiet():
        cls = checkpoint_class(config)
        dtype = dtype or config_dtype(config)
        try:
            model = build_on_meta(cls, config, dtype)
        except Exception as exc:
            raise UserError(
                f"cannot build {cls.__name__} from {folder}/config.json on the meta "
                f"device: {one_line(exc)}"
            ) from None
    layout = find_text(model, getattr(config.get_text_config(), "vocab_size", None))
    return Described(folder, raw, config, cls, dtype, model, layout)


def text_weight_bytes(model, layout: TextLayout, dtype) -> int:
    """Bytes the text part (backbone + head, a tied head once) takes in `dtype`."""
    import torch

    size = torch.empty(0, dtype=dtype).element_size()
    seen, n = set(), 0
    for key, p in model.named_parameters(remove_duplicate=False):
        if layout.in_text(key) and id(p) not in seen:
            seen.add(id(p))
            n += p.numel() * (size if p.is_floating_point() else p.element_size())
    return n


def parameter_split(model, layout: TextLayout) -> dict:
    """Parameter count and bytes for the text part (backbone + head), vision and other."""
    out = {k: {"params": 0, "bytes": 0, "modules": set()} for k in ("text", "vision", "other")}
    for path, p in model.named_parameters():
        if layout.in_text(path):
            group = "text"
            top = layout.backbone_path if _under(path, layout.backbone_path) else layout.head_path
        else:
            top = _top_outside(path, layout.backbone_path)
            group = "vision" if VISION_NAME.search(top) else "other"
        out[group]["params"] += p.numel()
        out[group]["bytes"] += p.numel() * p.element_size()
        out[group]["modules"].add(top or "(root)")
    for v in out.values():
        v["modules"] = sorted(v["modules"])
    out["total"] = {
        "params": sum(out[k]["params"] for k in ("text", "vision", "other")),
        "bytes": sum(out[k]["bytes"] for k in ("text", "vision", "other")),
    }
    return out


def _top_outside(path: str, backbone: str) -> str:
    """The first component of `path` that leaves the backbone's ancestor chain."""
    parts, anc = path.split("."), backbone.split(".") if backbone else []
    i = 0
    while i < len(anc) and i < len(parts) and parts[i] == anc[i]:
        i += 1
    return ".".join(parts[: i + 1])


def layer_signature(layer) -> str:
    """A layer's kind from its non-norm children, which tell full from linear attention."""
    parts = [
        f"{n}:{type(c).__name__}"
        for n, c in layer.named_children()
        if "norm" not in type(c).__name__.lower()
    ]
    return type(layer).__name__ + "(" + ", ".join(parts) + ")"


def index_ranges(idx: list[int]) -> str:
    """``[0, 1, 2, 4]`` -> ``"0..2,4"``."""
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
    """The module tree to `depth` levels, a ModuleList's entries grouped by signature."""
    from torch import nn

    node: dict[str, Any] = {
        "name": name,
        "class": type(module).__name__,
        "params": sum(p.numel() for p in module.parameters()),
    }
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
