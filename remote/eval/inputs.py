"""What an eval reads before any weights load, each checked: its spec, its ground-truth
file, the drafter against the target (docs/dflash-eval.md)."""

from __future__ import annotations

import json
import os
from typing import Any

from remote.errors import UserError
from remote.protocol import EvalSpec, ResultError, SpecError, completion_keys, sample_labels


def read_spec(path: str) -> EvalSpec:
    """The validated spec with defaults filled in; the four paths are required."""
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise UserError(f"cannot read spec {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"spec {path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    try:
        spec = EvalSpec.from_json(raw)
    except (SpecError, TypeError) as exc:
        raise UserError(f"spec {path}: {exc}") from None
    for key in ("target", "drafter", "ground_truth", "output_dir"):
        if not getattr(spec, key):
            raise UserError(f"spec needs {key!r} (a path)")
    return spec


def read_ground_truth(path: str, vocab: int, max_samples: int | None) -> list[dict[str, Any]]:
    """Samples from the JSONL file, each checked: non-empty prompt and completion, integer
    ids inside the target's vocabulary."""
    if not os.path.isfile(path):
        raise UserError(f"ground truth file {path} does not exist")
    rows = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                sid, prompt, completion = row.get("id", n), row["prompt_ids"], row["completion_ids"]
            except (json.JSONDecodeError, KeyError, AttributeError):
                raise UserError(
                    f'{path} line {n} is not {{"id", "prompt_ids", "completion_ids"}} JSON'
                ) from None
            for name, ids in (("prompt_ids", prompt), ("completion_ids", completion)):
                if not isinstance(ids, list) or not ids:
                    raise UserError(
                        f"{path} line {n} (id {sid}) has empty "
                        f"{name}; drop the sample or regenerate it"
                    )
                bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
                if bad is not None:
                    raise UserError(
                        f"{path} line {n} (id {sid}) has token id {bad!r} outside the target "
                        f"vocabulary (0..{vocab - 1}); was it made with another tokenizer?"
                    )
            try:
                labels = {**sample_labels(row), **completion_keys(row)}
            except (ResultError, SpecError) as exc:
                raise UserError(f"{path} line {n} (id {sid}): {exc}") from None
            rows.append({"id": sid, **labels, "prompt_ids": prompt, "completion_ids": completion})
            if max_samples and len(rows) >= max_samples:
                break
    if not rows:
        raise UserError(f"ground truth file {path} holds no samples")
    return rows


def check_compatible(dcfg, tinfo, fc_in: int | None) -> None:
    """Drafter vs target: layer ids in range, hidden width, vocabulary, mask id, fc width."""
    n = tinfo.num_layers
    bad = [i for i in dcfg.target_layer_ids if not 0 <= i < n]
    if bad:
        raise UserError(
            f"drafter target_layer_ids {bad} are outside the "
            f"target's {n} layers (0..{n - 1}); wrong target?"
        )
    if dcfg.hidden_size != tinfo.hidden_size:
        raise UserError(
            f"drafter hidden_size {dcfg.hidden_size} differs from "
            f"the target's {tinfo.hidden_size}; wrong target?"
        )
    if dcfg.vocab_size != tinfo.vocab_size:
        raise UserError(
            f"drafter vocab_size {dcfg.vocab_size} differs from "
            f"the target's {tinfo.vocab_size}; wrong target?"
        )
    if not 0 <= dcfg.mask_token_id < tinfo.vocab_size:
        raise UserError(
            f"drafter mask_token_id {dcfg.mask_token_id} is "
            f"outside the target vocabulary ({tinfo.vocab_size})"
        )
    want = len(dcfg.target_layer_ids) * dcfg.hidden_size
    if fc_in is not None and fc_in != want:
        raise UserError(
            f"drafter fc takes {fc_in} features but {len(dcfg.target_layer_ids)} "
            f"layers x hidden {dcfg.hidden_size} = {want}; fix target_layer_ids"
        )


def fc_width(path: str) -> int | None:
    """``fc`` input width of the drafter, read as `load_drafter` reads its weights (headers
    only for safetensors); None when the weights have no ``fc.weight``."""
    from remote.eval.drafter import normalise_key, weight_shapes

    keys, _problems = weight_shapes(path)
    for k, (_file, _dtype, shape) in keys.items():
        if normalise_key(k) == "fc.weight" and len(shape) == 2:
            return int(shape[1])
    return None
