"""``probe``: what a model really is on this host, as one JSON document (``dflash.probe/1``),
from its config and safetensors headers on the meta device (docs/probe.md)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.model.drafter_format import default_target_layer_ids  # noqa: F401 (tests and callers)
from remote.model.files import incomplete_reason, one_line, read_model_config, scan_checkpoint
from remote.model.keys import key_report
from remote.model.layout import (
    auto_class_choices,
    collapsed_tree,
    describe,
    layer_groups,
    layers_path_for,
    parameter_split,
)
from remote.probe.drafter_check import check_drafter, rope_summary
from remote.probe.facts import disk_free, meminfo
from remote.probe.load_check import load_and_verify
from remote.protocol import PROBE_SCHEMA, is_int

SCHEMA = PROBE_SCHEMA


def kernel_status(name: str) -> dict:
    """Whether an optional fast-kernel package imports here, and why not."""
    try:
        mod = importlib.import_module(name)
        return {"importable": True, "version": getattr(mod, "__version__", None)}
    except Exception as exc:  # ImportError, or a CUDA-less build raising at import time
        return {"importable": False, "reason": one_line(exc)}


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


def _head_counts(text_cfg) -> dict:
    return {
        k: v
        for k, v in sorted(vars(text_cfg).items())
        if is_int(v) and ("heads" in k or k.endswith("head_dim") or k == "head_dim")
    }


def text_part_class(acls, config) -> bool:
    """Whether `acls` is the text-only model of the VLM `config` (its ``config_class`` is
    the ``text_config``'s): the auto classes build it from the text config alone."""
    text_class = (getattr(config, "sub_configs", None) or {}).get("text_config")
    return text_class is not None and getattr(acls, "config_class", None) is text_class


def _text_part_entry(auto_name: str, acls, d, choices: dict, vocab) -> dict:
    """An auto class's entry for a VLM's text-only model, built from the text config."""
    text_cfg = d.config.get_text_config()
    entry = layers_path_for(acls, text_cfg, d.dtype, vocab)
    whole = choices.get("AutoModelForImageTextToText") or d.cls
    entry["built_from"] = "text_config"
    entry["note"] = (
        f"text part only: {auto_name} builds {acls.__name__} from the config's text_config "
        f"({type(text_cfg).__name__}), as transformers does for a VLM, and loads the "
        f"language model's weights without the vision tower; the whole model loads with "
        f"AutoModelForImageTextToText ({whole.__name__})"
    )
    return entry


def unknown_architectures(config, built: type) -> str | None:
    """The warning for ``architectures`` naming no class this transformers has: `built`
    is its ``model_type``'s class, as the eval builds it."""
    import transformers

    named = [a for a in getattr(config, "architectures", None) or [] if isinstance(a, str)]
    if not named or any(isinstance(getattr(transformers, a, None), type) for a in named):
        return None
    return (
        f"config.json's architectures names {', '.join(named)}, which transformers "
        f"{transformers.__version__} does not have: probed (and evaluated) as "
        f"{built.__name__}, its class for model_type {config.model_type!r}; if the keys "
        "below are missing or unexpected, install a transformers that has the class or "
        "correct architectures in config.json"
    )


def probe(model: str, drafter: str | None = None, load: bool = False, depth: int = 4) -> dict:
    """The whole probe as a dict (schema ``dflash.probe/1``)."""
    t0 = time.monotonic()
    folder = Path(os.path.expanduser(model)).resolve()
    read_model_config(folder)  # a bad path fails in milliseconds, before torch is imported
    drafter_folder = Path(os.path.expanduser(drafter)).resolve() if drafter else None
    if drafter_folder is not None:
        read_model_config(drafter_folder, "drafter")
    scan = scan_checkpoint(folder)
    d = describe(folder)
    meta_model, layout, config = d.model, d.layout, d.config
    text_cfg = config.get_text_config()
    vocab = getattr(text_cfg, "vocab_size", None)
    structure = layout.structure()
    layers = meta_model.get_submodule(layout.layers_path)
    num_layers = layout.num_layers
    hidden = getattr(text_cfg, "hidden_size", None)
    choices = auto_class_choices(config)
    auto_report = {}
    for name, acls in choices.items():
        if acls is None:
            auto_report[name] = None
        elif acls is d.cls:
            auto_report[name] = {"class": d.cls.__name__, "layers": layout.layers_path}
        elif text_part_class(acls, config):
            auto_report[name] = _text_part_entry(name, acls, d, choices, vocab)
        else:
            auto_report[name] = layers_path_for(acls, config, d.dtype, vocab)
    split = parameter_split(meta_model, layout)
    keys, mapping, converted = key_report(meta_model, scan, layout)
    cfg_types = getattr(text_cfg, "layer_types", None)
    ckpt_dtypes = Counter(v[1] for v in scan["keys"].values() if v[1] != "?")
    is_vlm = layout.backbone_path != "" and split["vision"]["params"] > 0
    text_raw = d.raw.get("text_config") or d.raw
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "model_path": str(folder),
        "model_type": config.model_type,
        "text_model_type": getattr(text_cfg, "model_type", None),
        "architectures": list(getattr(config, "architectures", None) or []),
        "warnings": [w for w in (unknown_architectures(config, d.cls),) if w],
        "is_vlm": is_vlm,
        "built_class": d.cls.__name__,
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
        "dtype": str(d.dtype).replace("torch.", ""),
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
            "shards_complete": scan["complete"],
        },
        "keys": keys,
        "host": host_report(folder, split["text"]["bytes"]),
        "tree": collapsed_tree(meta_model, "", depth),
        "drafter": None,
        "load": None,
    }
    target = {"num_layers": num_layers, "hidden_size": hidden, "vocab_size": vocab}
    if drafter_folder is not None:
        report["drafter"] = check_drafter(drafter_folder, target, text_raw)
    if load:
        if not scan["keys"]:
            raise UserError(f"cannot --load {folder}: no safetensors weights in it")
        report["load"] = load_and_verify(folder, layout, scan)
    report["probe_seconds"] = round(time.monotonic() - t0, 3)
    return report


def incomplete(report: dict) -> str | None:
    """Why a probed checkpoint's shards make it unusable, or None."""
    reason = incomplete_reason(report["checkpoint"])
    return (
        f"checkpoint in {report['model_path']} is incomplete: {reason}; copy it again"
        if reason
        else None
    )


def run(args) -> int:
    """Print the report; an incomplete checkpoint is an error, never a usable-looking report."""
    report = probe(args.model, args.drafter, args.load, args.depth)
    problem = incomplete(report)
    if problem:
        raise UserError(problem)
    print(json.dumps(report))
    return 0


def register(sub) -> None:
    p = sub.add_parser("probe", help="print a model's real structure as JSON (dflash.probe/1)")
    p.add_argument("--model", required=True, help="model folder (config.json + safetensors)")
    p.add_argument("--drafter", help="DFlash drafter folder to check against the model")
    p.add_argument(
        "--load",
        action="store_true",
        help="load the text backbone and verify hidden states with a short forward",
    )
    p.add_argument("--depth", type=int, default=4, help="depth of the module tree in the report")
    p.set_defaults(func=run)
