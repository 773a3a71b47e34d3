"""A model folder read without loading it (`read_header`, `ST_DTYPES`: the one copy)."""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.errors import UserError

INDEX_NAME = "model.safetensors.index.json"
# the largest header accepted: real many-shard checkpoints have headers of a few MiB
MAX_HEADER_BYTES = 100_000_000
ST_DTYPES = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "BF16": ("bfloat16", 2),
    "F16": ("float16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}


def dtype_bytes(name: str) -> int:
    """Bytes per element of the dtype torch calls `name`, from `ST_DTYPES`."""
    for torch_name, size in ST_DTYPES.values():
        if torch_name == name:
            return size
    raise KeyError(name)


OTHER_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".gguf")
# without any of these, transformers 5 builds an empty tokenizer from config.json alone
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "sentencepiece.model",
    "spm.model",
    "tekken.json",
)


def one_line(exc: BaseException) -> str:
    """An exception as ``Type: first line`` (library errors can span pages)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_json(path: Path, what: str) -> dict:
    """Parse a JSON file or raise a one-line UserError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise UserError(f"cannot read {what} {path}: {reason}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} is not a JSON object")
    return data


def read_model_config(folder: Path, what: str = "model") -> dict:
    """The raw ``config.json`` of a model folder; a missing folder or file is a UserError."""
    folder = Path(folder)
    if not folder.exists():
        raise UserError(f"{what} folder not found: {folder}")
    if not folder.is_dir():
        raise UserError(f"{what} path is not a folder: {folder}")
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise UserError(f"no config.json in {what} folder {folder}")
    return read_json(cfg, "config")


def no_tokenizer(folder: str | Path) -> str:
    """The one line for a target folder without a usable tokenizer, and what to do."""
    return (
        f"target folder {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:5])}, "
        "...): text prompts cannot be tokenised; add the target's tokenizer files to that "
        "folder, or give token-id ground truth with --ground-truth-kind file "
        '--ground-truth PATH, or token-id prompts ({"id", "prompt_ids"} lines)'
    )


def require_tokenizer(folder: str | Path) -> None:
    """Raise `no_tokenizer` unless `folder` holds a tokenizer file (nothing loaded)."""
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(no_tokenizer(folder))


def build_config(folder: Path, raw: dict | None = None):
    """A transformers config from the folder; an unknown model_type says what to upgrade."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = read_model_config(Path(folder)) if raw is None else raw
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
        raise UserError(
            f"model_type {model_type!r} in {folder}/config.json is unknown to "
            f"transformers {have} on this host; {hint}"
        )
    try:
        return AutoConfig.from_pretrained(str(folder))
    except Exception as exc:
        raise UserError(f"transformers cannot read {folder}/config.json: {one_line(exc)}") from None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


@dataclass
class Header:
    """A safetensors file's header: ``tensors`` maps key -> {dtype, shape, data_offsets}."""

    path: Path
    tensors: dict[str, dict]
    data_start: int
    size: int

    @property
    def data_end(self) -> int:
        """The byte offset the last tensor ends at (what the file's size must reach)."""
        return self.data_start + max(
            (int(t["data_offsets"][1]) for t in self.tensors.values()), default=0
        )


def read_header(path: Path) -> Header:
    """A safetensors header, only its bytes read; a short or bad one is a UserError."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise UserError(f"shard {path} is truncated: {size} bytes, no safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise UserError(
                    f"shard {path} is truncated or not safetensors: header says "
                    f"{n} bytes, file has {size}"
                )
            header = json.loads(fh.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"shard {path} has an unreadable safetensors header") from None
    except OSError as exc:
        raise UserError(f"cannot read shard {path}: {exc.strerror or exc}") from None
    if not isinstance(header, dict):
        raise UserError(f"shard {path} has an unreadable safetensors header")
    header.pop("__metadata__", None)
    for key, info in header.items():
        if (
            not isinstance(info, dict)
            or info.get("dtype") not in ST_DTYPES
            or not isinstance(info.get("shape"), list)
            or not isinstance(info.get("data_offsets"), list)
            or len(info["data_offsets"]) != 2
        ):
            kind = info.get("dtype") if isinstance(info, dict) else None
            raise UserError(
                f"shard {path}: tensor {key} has an unreadable entry"
                + (f" (dtype {kind} is not supported)" if kind else "")
            )
    return Header(path, header, 8 + n, size)


def tensor_bytes(info: dict, float_bytes: int | None = None) -> int:
    """Bytes of one header entry, floating tensors counted at `float_bytes` when given."""
    n = 1
    for d in info["shape"]:
        n *= int(d)
    kind = info["dtype"]
    per = ST_DTYPES[kind][1]
    if float_bytes is not None and kind.startswith(("F", "BF")):
        per = float_bytes
    return n * per


def scan_checkpoint(folder: Path) -> dict:
    """Shard files, keys, dtypes and completeness from headers; bad shards listed, not raised."""
    folder = Path(folder)
    index_path = folder / INDEX_NAME
    index = None
    if index_path.exists():
        index = read_json(index_path, "safetensors index")
        wm = index.get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise UserError(f"safetensors index {index_path} has no usable weight_map")
        for name in set(wm.values()):
            if os.path.isabs(name) or ".." in Path(name).parts:
                raise UserError(
                    f"safetensors index {index_path} names a shard outside the folder: {name!r}"
                )
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
        header = read_header(path)
        on_disk += header.size
        for key, info in header.tensors.items():
            keys[key] = (name, info["dtype"], list(info["shape"]))
        if header.data_end > header.size:
            truncated.append({"file": name, "size": header.size, "expected": header.data_end})
    if index is not None:
        for key, name in index["weight_map"].items():
            keys.setdefault(key, (name, "?", []))
    other = sorted(p.name for p in folder.iterdir() if p.suffix in OTHER_WEIGHT_SUFFIXES)
    return {
        "files": expected_files,
        "index": INDEX_NAME if index is not None else None,
        "keys": keys,
        "missing_shards": missing,
        "truncated_shards": truncated,
        "bytes_on_disk": on_disk,
        "other_weight_files": other,
        "complete": not missing and not truncated,
    }


def incomplete_reason(scan: dict) -> str | None:
    """One phrase naming the missing and truncated shards, or None when all are whole."""
    parts = [f"shard {m} is missing" for m in scan["missing_shards"]]
    parts += [
        f"shard {t['file']} is truncated ({t['size']} of {t['expected']} bytes)"
        for t in scan["truncated_shards"]
    ]
    return "; ".join(parts) or None


def require_complete(folder: Path, scan: dict, what: str = "checkpoint") -> None:
    """Raise a UserError when a shard is missing or truncated."""
    reason = incomplete_reason(scan)
    if reason:
        raise UserError(f"{what} in {folder} is incomplete: {reason}; copy it again")


class Mapped:
    """A safetensors file mapped read-only, copy-on-write, as one byte tensor its tensors view."""

    def __init__(self, path: Path):
        import mmap

        import torch

        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
        finally:
            os.close(fd)
        self.bytes = (
            torch.frombuffer(self._map, dtype=torch.uint8)
            if self._map is not None
            else torch.empty(0, dtype=torch.uint8)
        )

    def view(self, start: int, nbytes: int, dtype, shape: list[int]):
        """The tensor of `dtype` and `shape` at ``start``; None if not whole or misaligned."""
        import torch

        item = torch.empty(0, dtype=dtype).element_size()
        if start % item or start + nbytes > self.bytes.numel():
            return None
        return self.bytes[start : start + nbytes].view(dtype).view(shape)


class LazyTensor:
    """A safetensors tensor read when indexed: a `Mapped` view, else pread."""

    def __init__(
        self, path: Path, key: str, info: dict, data_start: int, mapped: Mapped | None = None
    ):
        self.path, self.key, self.mapped = Path(path), key, mapped
        self.dtype_name = info["dtype"]
        self.shape = [int(d) for d in info["shape"]]
        self.start = data_start + int(info["data_offsets"][0])
        self.nbytes = int(info["data_offsets"][1]) - int(info["data_offsets"][0])

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def __getitem__(self, index: Any):
        import torch

        if index is not Ellipsis:
            return self[...][index]
        dtype = getattr(torch, ST_DTYPES[self.dtype_name][0])
        t = torch.empty(self.shape, dtype=dtype, device="meta")
        if self.nbytes != t.numel() * t.element_size():
            raise UserError(
                f"{self.path}: tensor {self.key} has {self.nbytes} bytes for shape "
                f"{self.shape}; the shard is corrupt, copy it again"
            )
        if self.mapped is not None:
            view = self.mapped.view(self.start, self.nbytes, dtype, self.shape)
            if view is not None:
                return view
        t = torch.empty(self.shape, dtype=dtype)
        if self.nbytes:
            view = memoryview(t.view(-1).view(torch.uint8).numpy())
            fd = os.open(self.path, os.O_RDONLY)
            try:
                done = 0
                while done < self.nbytes:
                    got = os.preadv(fd, [view[done:]], self.start + done)
                    if got <= 0:
                        raise UserError(
                            f"{self.path} is truncated (tensor {self.key}); "
                            "copy the checkpoint again"
                        )
                    done += got
            finally:
                os.close(fd)
        return t


def lazy_tensors(
    folder: Path, scan: dict, mapped: set[str] | frozenset = frozenset()
) -> dict[str, LazyTensor]:
    """Checkpoint key -> `LazyTensor` of a complete checkpoint (views for `mapped` files)."""
    require_complete(folder, scan)
    out: dict[str, LazyTensor] = {}
    for name in scan["files"]:
        header = read_header(Path(folder) / name)
        mapping = Mapped(header.path) if mapped & header.tensors.keys() else None
        for key, info in header.tensors.items():
            own = mapping if key in mapped else None
            out[key] = LazyTensor(header.path, key, info, header.data_start, own)
    return out
