"""Reading a model folder without loading weights: config.json, the safetensors index and
headers, and what they say about missing or truncated shards. Used by the probe."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from remote.errors import UserError

INDEX_NAME = "model.safetensors.index.json"


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
                        f"{one_line(exc)}") from None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def one_line(exc: BaseException) -> str:
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
