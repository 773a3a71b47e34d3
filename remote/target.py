"""Load a target for evaluation: its TEXT backbone, ``embed_tokens`` and ``lm_head`` only.

The full architecture (for a vision-language target, the whole multimodal wrapper) is built
on the ``meta`` device, which costs no memory. The text backbone is then found by inspecting
the module tree (the module owning ``embed_tokens`` and a decoder ``layers`` list), and only
the checkpoint tensors that map onto the backbone and the head are read, following
transformers' own checkpoint-key renamings, so vision weights are never materialised.

Hidden states come from forward hooks on the backbone's decoder layers (raw layer outputs,
even for the last layer, whose ``output_hidden_states`` entry is final-normed), keeping only
the layers the drafter needs. The backbone is always called directly, never the wrapper.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from remote.errors import UserError


@dataclass
class TargetInfo:
    """What was found in the module tree, for reports."""

    architecture: str
    backbone_path: str
    layers_path: str
    head_path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    layer_types: list[str] | None
    tied_head: bool


def read_config(path: str):
    """The target's transformers config (``AutoConfig``), or a UserError saying why not."""
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"no config.json in target folder {path}; pass a Hugging Face model folder")
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise UserError(f"transformers cannot read the target config in {path}: {exc}")


def build_meta(config) -> nn.Module:
    """The full model the config's ``architectures`` names, on the meta device (no memory)."""
    import transformers

    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    with torch.device("meta"):
        if cls is not None:
            return cls(config)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(config)


def find_text_parts(model: nn.Module) -> tuple[str, str, str]:
    """(backbone path, decoder-layers path, head path) found in the module tree.

    The backbone is the module that owns ``embed_tokens`` and a ``layers`` ModuleList; when
    several match (encoder-decoder), the one with the most layers whose embedding is the
    model's input embedding wins. The head is the model's output embedding.
    """
    names = {id(m): n for n, m in model.named_modules()}
    candidates = []
    for name, mod in model.named_modules():
        layers = getattr(mod, "layers", None)
        if isinstance(getattr(mod, "embed_tokens", None), nn.Embedding) and isinstance(layers, nn.ModuleList):
            candidates.append((name, len(layers)))
    if not candidates:
        raise UserError(f"cannot find a text decoder (a module with embed_tokens and layers) in {type(model).__name__}")
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    preferred = [c for c in candidates if inp is not None and getattr(model.get_submodule(c[0]), "embed_tokens") is inp]
    backbone = max(preferred or candidates, key=lambda c: c[1])[0]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or id(head) not in names:
        raise UserError(f"{type(model).__name__} has no LM head (output embedding); it cannot be a speculative-decoding target")
    return backbone, (backbone + "." if backbone else "") + "layers", names[id(head)]


def _checkpoint_files(path: str) -> dict[str, str]:
    """Checkpoint key -> file, from the safetensors index or the single file."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as fh:
            return {k: os.path.join(path, v) for k, v in json.load(fh)["weight_map"].items()}
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        reader = SafetensorsReader(single)
        reader.close()
        return {k: single for k in reader.header}
    raise UserError(f"no safetensors weights in target folder {path} (model.safetensors or an index)")


_ST_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsReader:
    """Reads single tensors of a safetensors file with plain ``readinto`` into their final
    buffers. Unlike the mmap-based ``safe_open``, no file page stays mapped into this process,
    so the resident set grows by the loaded tensors only (a 52 GB checkpoint is not counted
    twice: once mapped, once copied)."""

    def __init__(self, path: str):
        self.path = path
        self.fh = open(path, "rb")
        n = int.from_bytes(self.fh.read(8), "little")
        self.header = json.loads(self.fh.read(n))
        self.header.pop("__metadata__", None)
        self.base = 8 + n

    def get(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        meta = self.header[key]
        src = _ST_DTYPES.get(meta["dtype"])
        if src is None:
            raise UserError(f"{self.path}: tensor {key} has dtype {meta['dtype']}, which the eval cannot read")
        start, end = meta["data_offsets"]
        t = torch.empty(meta["shape"], dtype=src)
        self.fh.seek(self.base + start)
        if end > start:
            view = memoryview(t.view(-1).view(torch.uint8).numpy())
            if self.fh.readinto(view) != end - start:
                raise UserError(f"{self.path} is truncated (tensor {key}); copy the checkpoint again")
        return t if dtype is None or not t.is_floating_point() else t.to(dtype)

    def close(self) -> None:
        self.fh.close()


def _renamers(model: nn.Module) -> list[tuple[str, str]]:
    """(regex, replacement) pairs from transformers' checkpoint conversion mapping for this
    model, plus the classic VLM layouts, tried in order when a key does not match as is."""
    pairs: list[tuple[str, str]] = []
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping

        for t in get_model_conversion_mapping(model):
            src = getattr(t, "source_patterns", None)
            dst = getattr(t, "target_patterns", None)
            if not src or not dst or getattr(t, "operations", None):
                continue  # merges/splits are not renames: not needed for the text stack
            for s in src if isinstance(src, list) else [src]:
                d = dst[0] if isinstance(dst, list) else dst
                pairs.append((s, d))
    except Exception:
        pass  # older/newer transformers: fall back to the layouts below
    pairs += [
        (r"^language_model\.lm_head\.", "lm_head."),
        (r"^language_model\.model\.", "model.language_model."),
        (r"^model\.language_model\.", "language_model."),
        (r"^language_model\.", "model.language_model."),
        (r"^model\.", ""),
    ]
    return pairs


def map_checkpoint_keys(ckpt_keys: list[str], wanted: set[str], model: nn.Module) -> dict[str, str]:
    """Model key -> checkpoint key for every wanted model key found in the checkpoint."""
    found: dict[str, str] = {}
    renamers = _renamers(model)
    for ck in ckpt_keys:
        if ck in wanted:
            found.setdefault(ck, ck)
            continue
        for pat, rep in renamers:
            try:
                mk = re.sub(pat, rep, ck, count=1)
            except re.error:
                continue
            if mk != ck and mk in wanted:
                found.setdefault(mk, ck)
                break
    return found


def _set_tensor(root: nn.Module, key: str, value: torch.Tensor) -> None:
    mod_path, _, leaf = key.rpartition(".")
    mod = root.get_submodule(mod_path) if mod_path else root
    if leaf in mod._parameters:
        mod._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        mod._buffers[leaf] = value


class Target:
    """The text part of a target model, ready for one forward per sequence.

    ``embed`` and ``lm_head`` are weight matrices [vocab, hidden] (the drafter borrows them).
    """

    def __init__(self, model: nn.Module, info: TargetInfo, dtype: torch.dtype):
        self.model = model  # full tree; only backbone + head are materialised
        self.info = info
        self.dtype = dtype
        self.backbone = model.get_submodule(info.backbone_path) if info.backbone_path else model
        self.layers = model.get_submodule(info.layers_path)
        self.head = model.get_submodule(info.head_path)

    @property
    def embed(self) -> torch.Tensor:
        return self.backbone.embed_tokens.weight

    @property
    def lm_head(self) -> torch.Tensor:
        return self.head.weight

    @torch.inference_mode()
    def forward(
        self, ids: list[int] | torch.Tensor, layer_ids: list[int], argmax_from: int = 0, chunk: int = 256
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over ``ids``. Returns (features [T, len(layer_ids)*hidden] = raw outputs
        of the named decoder layers concatenated in order, greedy argmax [T - argmax_from] of
        the head at positions ``argmax_from..T-1``). The head runs in chunks of positions so a
        large vocabulary never materialises [T, vocab] logits."""
        ids_t = torch.as_tensor(ids, dtype=torch.long)[None]
        keep: dict[int, torch.Tensor] = {}
        hooks = []
        for i in sorted(set(layer_ids)):
            def hook(_m, _args, out, i=i):
                keep[i] = (out[0] if isinstance(out, (tuple, list)) else out)[0]
            hooks.append(self.layers[i].register_forward_hook(hook))
        try:
            out = self.backbone(input_ids=ids_t, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        last = out.last_hidden_state[0]
        feats = torch.cat([keep[i] for i in layer_ids], dim=-1)
        del keep
        arg = []
        for a in range(argmax_from, last.shape[0], chunk):
            arg.append(torch.argmax(self.head(last[a:a + chunk]).float(), dim=-1))
        greedy = torch.cat(arg) if arg else torch.zeros(0, dtype=torch.long)
        return feats, greedy


def describe(path: str) -> tuple[Any, nn.Module, TargetInfo]:
    """Config, meta model and text-part info of a target, without loading any weights."""
    config = read_config(path)
    model = build_meta(config)
    backbone, layers_path, head = find_text_parts(model)
    bb = model.get_submodule(backbone) if backbone else model
    text_cfg = getattr(bb, "config", None) or config
    info = TargetInfo(
        architecture=type(model).__name__,
        backbone_path=backbone,
        layers_path=layers_path,
        head_path=head,
        num_layers=len(model.get_submodule(layers_path)),
        hidden_size=int(bb.embed_tokens.weight.shape[1]),
        vocab_size=int(bb.embed_tokens.weight.shape[0]),
        layer_types=list(getattr(text_cfg, "layer_types", None) or []) or None,
        tied_head=model.get_submodule(head).weight is bb.embed_tokens.weight,
    )
    return config, model, info


def text_weight_bytes(model: nn.Module, info: TargetInfo, dtype: torch.dtype) -> int:
    """Bytes the backbone + head take in ``dtype`` (the memory check's main term)."""
    bb = model.get_submodule(info.backbone_path) if info.backbone_path else model
    n = sum(p.numel() for p in bb.parameters())
    head = model.get_submodule(info.head_path).weight
    if head is not bb.embed_tokens.weight:
        n += head.numel()
    return n * torch.empty(0, dtype=dtype).element_size()


def load_target(path: str, dtype: torch.dtype = torch.bfloat16) -> Target:
    """Load only the text backbone + head of the target in ``path``, in ``dtype``."""
    config, model, info = describe(path)
    bb_prefix = info.backbone_path + "." if info.backbone_path else ""
    full_sd_keys = list(model.state_dict().keys())
    wanted = {k for k in full_sd_keys if k.startswith(bb_prefix) or k.startswith(info.head_path + ".")}
    files = _checkpoint_files(path)
    mapping = map_checkpoint_keys(list(files), wanted, model)
    head_key = info.head_path + ".weight"
    missing = sorted(k for k in wanted - set(mapping) if not (k == head_key and info.tied_head))
    # Non-persistent buffers (rotary inv_freq) are not in state_dict and are rebuilt below.
    if missing:
        raise UserError(f"target checkpoint lacks {', '.join(missing[:6])} (and {max(0, len(missing) - 6)} more); is the download complete?")
    keep_fp32 = set(getattr(model, "_keep_in_fp32_modules", None) or []) | set(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    by_file: dict[str, list[tuple[str, str]]] = {}
    for mk, ck in mapping.items():
        by_file.setdefault(files[ck], []).append((mk, ck))
    for f, pairs in by_file.items():
        reader = SafetensorsReader(f)
        try:
            for mk, ck in sorted(pairs, key=lambda p: reader.header[p[1]]["data_offsets"][0]):  # sequential reads
                fp32 = any(part in mk.split(".") for part in keep_fp32)
                _set_tensor(model, mk, reader.get(ck, torch.float32 if fp32 else dtype))
        finally:
            reader.close()
    if info.tied_head and head_key not in mapping:
        model.get_submodule(info.head_path).weight = model.get_submodule(bb_prefix + "embed_tokens" if bb_prefix else "embed_tokens").weight
    backbone = model.get_submodule(info.backbone_path) if info.backbone_path else model
    _rebuild_buffers(backbone)
    leftovers = [n for n, p in list(backbone.named_parameters()) + list(backbone.named_buffers()) if p.is_meta]
    if leftovers:
        raise UserError(f"target weights {', '.join(leftovers[:6])} were not loaded; report this checkpoint layout")
    backbone.eval()
    if getattr(backbone.config, "_attn_implementation", None) in (None, "flex_attention", "flash_attention_2"):
        backbone.config._attn_implementation = "sdpa"
    return Target(model, info, dtype)


def _rebuild_buffers(root: nn.Module) -> None:
    """Recreate non-persistent buffers left on meta (rotary ``inv_freq`` and the like) by
    constructing a fresh copy of their owning module from its config on the CPU."""
    for name, mod in root.named_modules():
        meta = [b for b, t in mod._buffers.items() if t is not None and t.is_meta]
        if not meta:
            continue
        cfg = getattr(mod, "config", None)
        if cfg is None:
            raise UserError(f"cannot rebuild buffer {name}.{meta[0]} of {type(mod).__name__}; report this architecture")
        fresh = type(mod)(config=cfg)
        for b in meta:
            mod._buffers[b] = fresh._buffers[b]
        for attr in ("attention_scaling",):
            if hasattr(fresh, attr):
                setattr(mod, attr, getattr(fresh, attr))
