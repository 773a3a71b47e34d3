"""Load the text part of a model (backbone + head) and nothing else; how: docs/probe.md (load)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from remote.errors import UserError
from remote.model.files import lazy_tensors, one_line, require_complete, scan_checkpoint
from remote.model.keys import conversion_mapping, map_checkpoint_keys, missing_keys
from remote.model.layout import Described, describe


def plan_text(
    folder: str | Path, dtype, described: Described | None = None
) -> tuple[Described, dict, dict[str, str]]:
    """Everything `load_text` checks before reading a tensor: (description, scan, key map)."""
    d = described or describe(folder, dtype)
    model, layout = d.model, d.layout
    quant = getattr(d.config, "quantization_config", None)
    if quant:
        method = (
            quant.get("quant_method")
            if isinstance(quant, dict)
            else getattr(quant, "quant_method", None)
        )
        raise UserError(
            f"{layout.architecture} checkpoint in {d.folder} is quantized "
            f"({method or 'unknown method'}); the eval reads bf16/fp16/fp32 "
            "weights only: point it at a dequantized copy"
        )
    if layout.head_path is None:
        raise UserError(
            f"{layout.architecture} has no LM head (output embedding); it cannot "
            "be a speculative-decoding target"
        )
    scan = scan_checkpoint(d.folder)
    require_complete(d.folder, scan, "target checkpoint")
    if not scan["keys"]:
        raise UserError(
            f"no safetensors weights in target folder {d.folder} (model.safetensors or an index)"
        )
    meta_sd = model.state_dict()
    text_keys = {k for k in meta_sd if layout.in_text(k)}
    mapping, _converted = map_checkpoint_keys(model, scan["keys"], meta_sd)
    wanted = {ck: mk for ck, mk in mapping.items() if mk in text_keys}
    missing = sorted(missing_keys(model, wanted, text_keys))
    if missing:
        raise UserError(
            f"target checkpoint lacks {', '.join(missing[:6])}"
            + (f" (and {len(missing) - 6} more)" if len(missing) > 6 else "")
            + f"; is the download of {d.folder} complete?"
        )
    return d, scan, wanted


def kept_as_stored(model, scan: dict, wanted: dict[str, str], dtype) -> set[str]:
    """Keys of `wanted` kept as stored (`dtype`, renamed at most): mapped, not read."""
    import torch

    from remote.model.files import ST_DTYPES

    _mapping, converted = map_checkpoint_keys(model, scan["keys"], model.state_dict())
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else None
    return {
        key
        for key in wanted
        if key not in converted and ST_DTYPES.get(scan["keys"][key][1], ("",))[0] == name
    }


@contextmanager
def _sequential_reads():
    """transformers' switch for reading tensors one at a time (docs/probe.md)."""
    key = "HF_DEACTIVATE_ASYNC_LOAD"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def load_text(
    folder: str | Path, dtype, plan: tuple | None = None, ends_only: bool = False
) -> Described:
    """Load the text part of `folder` in `dtype` on the CPU (`ends_only`: embedding, head)."""
    import torch
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig

    d, scan, wanted = plan or plan_text(folder, dtype)
    model, layout, dtype = d.model, d.layout, d.dtype
    part = layout.in_ends if ends_only else layout.in_text
    wanted = {ck: mk for ck, mk in wanted.items() if part(mk)}
    tensors = lazy_tensors(d.folder, scan, kept_as_stored(model, scan, wanted, dtype))
    state = {ck: tensors[ck] for ck in wanted}
    config = LoadStateDictConfig(
        pretrained_model_name_or_path=str(d.folder),
        dtype=dtype,
        dtype_plan=model._get_dtype_plan(dtype),
        weight_mapping=conversion_mapping(model),
    )
    try:
        with _sequential_reads():
            info, _ = convert_and_load_state_dict_in_model(model, state, config)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"transformers could not load the text weights of "
            f"{layout.architecture} from {d.folder}: {one_line(exc)}"
        ) from None
    del state, tensors
    bad = [
        f"{k}: checkpoint {tuple(a)} vs model {tuple(b)}"
        for k, a, b in sorted(info.mismatched_keys)
        if part(k)
    ]
    bad += [f"{k}: {v}" for k, v in sorted((info.conversion_errors or {}).items())]
    if bad:
        raise UserError(
            f"target weights do not fit {layout.architecture}: {bad[0]}"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        )
    with torch.no_grad():
        _allocate_unloaded(model, part)
        _init_text_buffers(model, layout, part)
        model.tie_weights(missing_keys=set(info.missing_keys), recompute_mapping=False)
    left = [
        k
        for k, t in list(model.named_parameters()) + list(model.named_buffers())
        if part(k) and t.is_meta
    ]
    if left:
        raise UserError(
            f"target weights {', '.join(left[:6])} of {layout.architecture} were "
            "not loaded; report this architecture"
        )
    backbone = model.get_submodule(layout.backbone_path) if layout.backbone_path else model
    for sub in (backbone, model.get_submodule(layout.head_path)):
        sub.eval().requires_grad_(False)
    cfg = getattr(backbone, "config", None)
    if cfg is not None:
        cfg._attn_implementation = attention_implementation(model, layout)
    return d


def attention_implementation(model, layout) -> str | None:
    """The config's attention kernel, else ``sdpa`` where a CPU host may lack it."""
    backbone = model.get_submodule(layout.backbone_path) if layout.backbone_path else model
    got = getattr(getattr(backbone, "config", None), "_attn_implementation", None)
    return "sdpa" if got in (None, "flex_attention", "flash_attention_2") else got


def _allocate_unloaded(model, part) -> None:
    """Give CPU memory to buffers of `part` the checkpoint does not hold, as transformers does."""
    import torch
    from transformers.modeling_utils import _load_parameter_into_model

    tied = getattr(model, "all_tied_weights_keys", None) or {}
    for key, buf in list(model.named_buffers()):
        if part(key) and buf.is_meta and key not in tied:
            _load_parameter_into_model(model, key, torch.empty_like(buf, device="cpu"))


def _init_text_buffers(model, layout, part) -> None:
    """The model's ``initialize_weights`` over the text part: computed buffers filled."""
    from transformers import PreTrainedModel
    from transformers import initialization as init

    def walk(module, path: str, owner) -> None:
        for name, child in module.named_children():
            walk(
                child,
                f"{path}.{name}" if path else name,
                child if isinstance(child, PreTrainedModel) else owner,
            )
        if part(path) and (path or not layout.backbone_path):
            owner._initialize_weights(module, owner.is_custom_code())

    with init.guard_torch_init_functions():
        walk(model, "", model)
