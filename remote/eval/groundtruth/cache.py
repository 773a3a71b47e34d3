"""The ground-truth cache, ``<workdir>/groundtruth/<key>.jsonl`` with its ``.json`` meta: the
key (the target's identity, the exact prompt ids, the sampling, the source), reading an
entry back only when every completion passes its checks again, and, after the eval,
taking an entry the target disagrees with wholesale out of the cache (`judge`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.protocol import agreement_suspect, flag_suspect

Emit = Callable[..., None]


# Bumped when what a cache entry means changes, so older entries are never hit.
CACHE_VERSION = 2


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def target_identity(target: str) -> dict:
    """What identifies a target without reading its weights: path, config hash, files."""
    root = Path(target)
    config = root / "config.json"
    try:
        config_hash = hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError:
        raise UserError(f"no config.json in target folder {target}") from None
    files = sorted(
        (p.name, p.stat().st_size) for p in root.iterdir() if p.suffix in WEIGHT_SUFFIXES
    )
    return {"path": str(root.resolve()), "config_sha256": config_hash, "weights": files}


def cache_key(
    identity: dict,
    prompt_ids: list[list[int]],
    sampling: dict,
    kind: str,
    source: dict | None = None,
    labels: list[dict] | None = None,
) -> str:
    """The cache entry's name: a hash of the target's identity, the sampling parameters, the
    kind of source, the source's own identity (URL and served model, `served_model`),
    every prompt's exact ids and, when any prompt has one, the prompts' labels."""
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "v": CACHE_VERSION,
                "target": identity,
                "sampling": sampling,
                "kind": kind,
                "source": source or {},
            },
            sort_keys=True,
        ).encode()
    )
    for ids in prompt_ids:
        h.update(json.dumps(ids).encode() + b"\n")
    if labels and any(labels):  # unlabelled sets keep the names they always had
        h.update(json.dumps(labels, sort_keys=True).encode())
    return h.hexdigest()[:24]


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def evict(path: Path, keep: Path | None = None) -> None:
    """Drop the cache entry whose data file is `path` (and its ``.json`` meta); with
    `keep`, its data is moved there instead of deleted (same filesystem: the workdir)."""
    meta = path.with_suffix(".json")
    for file, to in ((meta, None), (path, keep)):
        try:
            if to is not None:
                os.replace(file, to)
            else:
                file.unlink()
        except FileNotFoundError:
            pass


def read_cache(
    path: Path, meta_path: Path, prompt_ids: list[list[int]], check: Callable[[Any, str], list[int]]
) -> tuple[list[dict], dict] | None:
    """(records, meta) of a cache entry that passes every check, else None (missing,
    unreadable, another prompt list, or ids that `check` refuses)."""
    try:
        meta = json.loads(meta_path.read_text())
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or len(records) != len(prompt_ids):
        return None
    try:
        for r, ids in zip(records, prompt_ids, strict=False):
            if not isinstance(r, dict) or r.get("prompt_ids") != ids:
                return None
            check(r.get("completion_ids"), str(r.get("id")))
    except UserError:
        return None
    return records, meta


# Where a ground truth judged wrong wholesale goes: out of the cache, into its job's folder.
SUSPECT_FILE = "ground_truth.suspect.jsonl"


def judge(info: dict, agreement: Any, job_dir: Path, emit: Emit = lambda *a, **k: None) -> dict:
    """`info` (`prepare`'s) judged by the target's agreement with it (`agreement`: a result's
    ``metrics.target_agreement``). Below `remote.protocol.GT_SUSPECT_AGREEMENT` the ground
    truth is wrong wholesale, whatever its ids looked like: the info returned is flagged
    (``suspect``: agreement, threshold, evicted; a warning, also emitted) and its cache
    entry is taken out of the cache into `job_dir` (`SUSPECT_FILE`, which ``file`` then
    names), so no later eval reuses it and the answer stays there for a look. Otherwise
    `info` comes back as it was."""
    rate = agreement.get("rate") if isinstance(agreement, dict) else None
    sampled = bool((info.get("sampling") or {}).get("temperature"))
    if not agreement_suspect(rate, sampled):
        return info
    evicted = False
    if info.get("cache_key") and info.get("file"):
        kept = job_dir / SUSPECT_FILE
        evict(Path(info["file"]), keep=kept)
        if kept.is_file():
            evicted, info = True, {**info, "file": str(kept)}
    flagged = flag_suspect(info, rate, evicted)
    emit("warning", message=flagged["warnings"][-1])
    return flagged


def judge_job(info: dict, job_dir: Path, emit: Emit = lambda *a, **k: None) -> dict:
    """`judge` with the agreement of the job's own ``result.json`` (none there: as it was)."""
    try:
        result = json.loads((job_dir / "result.json").read_text())
    except (OSError, ValueError):
        return info
    metrics = result.get("metrics") if isinstance(result, dict) else None
    agreement = metrics.get("target_agreement") if isinstance(metrics, dict) else None
    return judge(info, agreement, job_dir, emit)
