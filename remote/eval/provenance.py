"""What exactly was evaluated: the drafter's sha256 and training step, recorded in every
result (stdlib only); how the digest and step are made: docs/results.md."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from remote.protocol import MANIFEST, is_int

CHUNK = 4 * 1024 * 1024


def listing_digest(files: list[dict]) -> str:
    """sha256 of the ``sha256sum`` listing of `files` ({path, sha256}), sorted by path."""
    lines = "".join(f"{f['sha256']}  {f['path']}\n" for f in sorted(files, key=lambda f: f["path"]))
    return hashlib.sha256(lines.encode()).hexdigest()


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _files(path: str) -> list[tuple[str, str]]:
    """(relative path, full path) of the checkpoint's regular files, hidden dflash files out."""
    if os.path.isfile(path):
        return [(os.path.basename(path), path)]
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if name.startswith(".dflash-") or not os.path.isfile(full) or os.path.islink(full):
                continue
            out.append((os.path.relpath(full, path), full))
    return out


def manifest_path(path: str) -> str:
    """Where the relay puts the manifest of the checkpoint at `path`."""
    path = path.rstrip("/")
    if os.path.isdir(path):
        return os.path.join(path, MANIFEST)
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{MANIFEST}")


def _read_manifest(path: str) -> dict | None:
    try:
        with open(manifest_path(path)) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    return data


def _manifest_files(path: str, manifest: dict) -> list[dict] | None:
    """The manifest's {path, sha256} list when it still matches the files and sizes on disk,
    else None (hash afresh)."""
    on_disk = dict(_files(path))
    files = []
    for f in manifest["files"]:
        if (
            not isinstance(f, dict)
            or not isinstance(f.get("path"), str)
            or not isinstance(f.get("sha256"), str)
        ):
            return None
        full = on_disk.pop(f["path"], None)
        if full is None or os.path.getsize(full) != f.get("size"):
            return None
        files.append({"path": f["path"], "sha256": f["sha256"]})
    return None if on_disk else files


def trainer_step(path: str) -> int | None:
    """``global_step`` from an HF-style ``trainer_state.json`` in the checkpoint folder."""
    try:
        with open(os.path.join(path, "trainer_state.json")) as fh:
            step = json.load(fh).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if is_int(step) else None


def drafter_identity(path: str) -> dict[str, Any]:
    """sha256, step and relay provenance of the drafter checkpoint at `path`."""
    manifest = _read_manifest(path)
    files = _manifest_files(path, manifest) if manifest else None
    hashed_by = "relay manifest"
    if files is None:
        files = [{"path": rel, "sha256": file_sha256(full)} for rel, full in _files(path)]
        hashed_by = "eval host"
    step, step_from = trainer_step(path), "trainer_state.json"
    if step is None and manifest and isinstance(manifest.get("step"), int):
        step, step_from = manifest["step"], "relay manifest"
    source = (
        (manifest or {}).get("source") if isinstance((manifest or {}).get("source"), dict) else None
    )
    return {
        "sha256": listing_digest(files) if files else None,
        "files": files,
        "hashed_by": hashed_by,
        "step": step,
        "step_from": step_from if step is not None else None,
        "relayed": manifest is not None,
        "source": {"host": source.get("host"), "path": source.get("path")} if source else None,
        "relayed_at": (manifest or {}).get("relayed_at"),
    }
