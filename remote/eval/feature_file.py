"""A feature-cache entry's safetensors file, never held twice in memory."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import BinaryIO

import torch

HEADER_MOST_BYTES = 2**20  # an entry's safetensors header is a few hundred bytes
ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.long: "I64"}

Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


def tensor_digest(*tensors: torch.Tensor) -> str:
    """sha256 of the tensors' bytes, in order (CPU, contiguous)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def parts(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list:
    """A safetensors file of `tensors` as buffers: header, then views."""
    header: dict = {"__metadata__": metadata}
    at = 0
    for key, t in tensors.items():
        n = t.numel() * t.element_size()
        header[key] = {
            "dtype": ST_DTYPE[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [at, at + n],
        }
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    views = [memoryview(t.view(-1).view(torch.uint8).numpy()) for t in tensors.values()]
    return [struct.pack("<Q", len(text)) + text, *views]


def header(fh: BinaryIO) -> bytes | None:
    """The first 8 bytes and header as one buffer; None without."""
    head = fh.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return head + fh.read(n) if n <= HEADER_MOST_BYTES else None


def read(fh: BinaryIO, head: bytes, shapes: Shapes, size: int) -> dict[str, torch.Tensor] | None:
    """The tensors of `shapes` when header and `size` are exact; else None."""
    offsets = _layout(head[8:], shapes)
    if offsets is None or size != len(head) + sum(nbytes(*s) for s in shapes.values()):
        return None
    out = {}
    for key in sorted(offsets, key=lambda k: offsets[k]):
        shape, dtype = shapes[key]
        out[key] = torch.empty(shape, dtype=dtype)
        view = memoryview(out[key].view(-1).view(torch.uint8).numpy())
        if fh.readinto(view) != len(view):
            return None
    return out


def metadata(head: bytes, key: str) -> dict | None:
    """The JSON object stored under `key` in the header's metadata; None if there is none."""
    try:
        (n,) = struct.unpack("<Q", head[:8])
        doc = json.loads(json.loads(head[8 : 8 + n])["__metadata__"][key])
    except Exception:
        return None
    return doc if isinstance(doc, dict) else None


def _layout(text: bytes, shapes: Shapes) -> dict[str, int] | None:
    """Each tensor's data offset when `text` holds exactly `shapes`."""
    try:
        doc = json.loads(text)
        got = {k: v for k, v in doc.items() if k != "__metadata__"}
        if set(got) != set(shapes):
            return None
        spans = []
        for key, (shape, dtype) in shapes.items():
            entry = got[key]
            if entry["dtype"] != ST_DTYPE[dtype] or tuple(entry["shape"]) != tuple(shape):
                return None
            a, b = entry["data_offsets"]
            if b - a != nbytes(shape, dtype):
                return None
            spans.append((a, b, key))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    spans.sort()
    if [a for a, _b, _k in spans] != [0] + [b for _a, b, _k in spans[:-1]]:
        return None
    return {k: a for a, _b, k in spans}
