"""The JSON types of an eval's result files; only fields read, optional unless `REQUIRED`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from remote.protocol.metrics import METRICS, SUM, WALK, Finding, Keyed, Metric, scalars
from remote.protocol.schemas import RESULT_SCHEMA
from remote.protocol.values import (
    ANY,
    FLAG,
    INT,
    NUM,
    SCALAR,
    STR,
    WHOLE_NUMBER_KEYS,
    accepts,
    any_of,
    list_of,
    map_of,
    type_words,
)


class ResultError(ValueError):
    """Result JSON of the wrong type; the message names field, value, type."""


SOURCE = {"host": STR, "path": STR}
DRAFTER_IDENTITY = {
    "sha256": STR,
    "step": INT,
    "step_from": STR,
    "hashed_by": STR,
    "relayed_at": SCALAR,
    "source": SOURCE,
}
GROUND_TRUTH = {
    "kind": STR,
    "url": STR,
    "path": STR,
    "file": STR,
    "cached": FLAG,
    "cache_key": STR,
    "warnings": list_of(STR),
    "retokenisation": {"mismatch_rate": NUM},
    "thinking": FLAG,
    "chat_template_sha256": STR,
}
PROMPTS = {"name": STR, "sha256": STR, "path": STR}


def _scalar_type(m: Metric) -> Any:
    if m.stored is not None:
        return {m.stored[0]: INT, m.stored[1]: INT, "rate": NUM}
    return INT if m.style == "count" else NUM


def _keyed_type(m: Keyed) -> Any:
    group = {m.group_name: INT} if m.group_name else {}
    if m.reduce == SUM and group:
        return list_of({**group, m.key_name: INT, m.num_name: INT})
    if m.reduce == SUM:
        return any_of(map_of(INT, WHOLE_NUMBER_KEYS), list_of(INT))
    row = {**group, m.key_name: INT, m.num_name: INT, m.den_name: INT, "rate": NUM}
    return list_of(any_of(row, NUM))


def _type(m: Any) -> Any:
    if isinstance(m, Keyed):
        return _keyed_type(m)
    return STR if isinstance(m, Finding) else _scalar_type(m)


def tau_types() -> dict:
    """The types of the walk metrics (a chain's or a DDTree budget's), by name."""
    return {m.name: _scalar_type(m) for m in scalars(WALK)}


def metrics_types() -> dict:
    """The types of a result's ``metrics``, from the metric registry."""
    out = {m.name: _type(m) for m in METRICS}
    out["ddtree"] = map_of({"budget": INT, "topk": INT, **tau_types()})
    return out


# a feature cache keeps the target's part of the round costs and a later eval reads it back
TARGET_COSTS = {
    "context_tokens": INT,
    "target_step_s": NUM,
    "target_verify_s": map_of(NUM, WHOLE_NUMBER_KEYS),
    "tree_verify_s": map_of(NUM, WHOLE_NUMBER_KEYS),
    "tree_verify_error": STR,
    "repeats": INT,
    # a part without a spread was read off the others (`remote.eval.round_timing`)
    "spread": map_of(list_of(NUM)),
}
ROUND_COSTS = {**TARGET_COSTS, "drafter_round_s": NUM, "target_costs": STR, "error": STR}
# all of the text part, or embedding and head alone (every feature and the costs cached)
TARGET_LOADED_WHOLE = "whole"
TARGET_LOADED_ENDS = "embedding_and_head"
RESULT = {
    "schema": STR,
    "samples_file": STR,
    "inputs": {
        "checkpoint": STR,
        "drafter": any_of(STR, {"path": STR}),
        "drafter_identity": DRAFTER_IDENTITY,
        "target_identity": {"config_sha256": STR, "weights": list_of(list_of(SCALAR))},
        "ground_truth_source": GROUND_TRUTH,
        "ground_truth_sha256": STR,
        "eval_engine": any_of(STR, {"name": STR}),
        "prompts": PROMPTS,
        "target": STR,
        "target_architecture": STR,
        "target_layers": INT,
        "target_vocab_size": INT,
        "drafter_window": {"longest_context": INT, "warning": STR, "window": {"reach": INT}},
        "target_features": {
            "cached": FLAG,
            "cache": STR,
            "cache_key": STR,
            "samples_cached": INT,
            "samples_stored": INT,
            "target_loaded": STR,
        },
    },
    "environment": {"dtype": STR},
    "timings": {
        "eval_s": NUM,
        "total_s": NUM,
        "tokens_per_s": NUM,
        "round_costs": ROUND_COSTS,
    },
    "job": {"job_id": STR, "host": STR, "created": NUM},
    "shards": {"hosts": list_of(STR), "ground_truth": {"obtained_on": STR}},
    "reassigned": list_of(
        {"host": STR, "reason": STR, "kept": list_of(ANY), "to": map_of(list_of(ANY))}
    ),
}
SPEC = {
    "checkpoint": STR,
    "host": STR,
    "created": NUM,
    "drafter": STR,
    "dtype": STR,
    "prompts": PROMPTS,
    "thinking": FLAG,
}
# carried from the prompts file into ground truth and sample records: category, sub-category
SAMPLE_LABELS = ("category", "subcategory")
# a label names a table row, CSV column and tracker tag: never a spreadsheet formula or markup
LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+-]{0,63}")


def label_problem(value: Any) -> str | None:
    """Why `value` cannot be a sample label (`LABEL_RE`), or None."""
    if not isinstance(value, str):
        return f"is {_shown(value)} ({type_words(value)}), expected a string"
    if not LABEL_RE.fullmatch(value):
        return (
            f"is {_shown(value)}, expected up to 64 letters, digits, spaces or . _ + -, "
            "starting with a letter or digit"
        )
    return None


def sample_labels(obj: Mapping) -> dict[str, str]:
    """The labels `obj` carries, each checked; a bad one is a `ResultError` naming it."""
    out = {}
    for key in SAMPLE_LABELS:
        value = obj.get(key)
        if value is None:
            continue
        why = label_problem(value)
        if why:
            raise ResultError(f"{key} {why}")
        out[key] = value
    return out


RECORD = {
    "id": SCALAR,
    "category": STR,
    "subcategory": STR,
    "tau": NUM,
    "rounds": list_of(INT),
    "ddtree": map_of(list_of(INT)),
    "prompt_tokens": INT,
    "completion_tokens": INT,
}
REQUIRED = {"result.json": ("schema",)}


def _shown(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(value: Any, expected: Any, where: str) -> None:
    """Raise `ResultError` unless `value` at `where` is `expected`; None passes."""
    if value is None:
        return
    if isinstance(expected, dict):
        if not isinstance(value, dict):
            raise ResultError(
                f"{where} is {_shown(value)} ({type_words(value)}), expected an object"
            )
        for key, inner in expected.items():
            _check(value.get(key), inner, f"{where}.{key}" if where else key)
        return
    if not expected(value):
        raise ResultError(
            f"{where} is {_shown(value)} ({type_words(value)}), expected {expected.expected}"
        )
    inner = expected.inner
    if isinstance(inner, tuple):
        _check(value, next(alt for alt in inner if accepts(alt, value)), where)
    elif inner is not None and isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, inner, f"{where}[{i}]")
    elif inner is not None and isinstance(value, dict):
        for key, item in value.items():
            if expected.keys is not None and not expected.keys(key):
                raise ResultError(
                    f"{where} has key {_shown(key)}, expected {expected.keys.expected}"
                )
            _check(item, inner, f"{where}.{key}")


def check_doc(doc: Any, table: Any, where: str = "") -> None:
    """Raise `ResultError` unless `doc` has the types of `table` (another result kind's)."""
    _check(doc, table, where)


def metrics_of(result: Mapping) -> dict:
    """The dataset metrics of a result: flat, or per dataset (``all``, else the first)."""
    m = result.get("metrics") or {}
    if not isinstance(m, dict):
        return m
    if any(k.name in m for k in scalars(WALK)):
        return m
    if m:
        if isinstance(m.get("all"), dict):
            return m["all"]
        first = next(iter(m.values()))
        if isinstance(first, dict):
            return first
    return {}


def check_result(doc: Any) -> None:
    """Raise `ResultError` unless `doc` (a parsed ``result.json``) has the expected types."""
    if not isinstance(doc, dict):
        raise ResultError(f"the document is {type_words(doc)}, expected an object")
    for key in REQUIRED["result.json"]:
        if key not in doc:
            raise ResultError(f"{key} is missing")
    _check(doc, RESULT, "")
    metrics = doc.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise ResultError(
            f"metrics is {_shown(metrics)} ({type_words(metrics)}), expected an object"
        )
    _check(metrics_of(doc), metrics_types(), "metrics")


def check_spec(doc: Any) -> None:
    """Raise `ResultError` unless `doc` (a parsed ``spec.json``) has the expected types."""
    _check(doc, SPEC, "")


def check_ground_truth(doc: Any) -> None:
    """Raise `ResultError` unless parsed ``ground_truth.json`` `doc` has the expected types."""
    _check(doc, GROUND_TRUTH, "")


def check_record(rec: Any) -> None:
    """Raise `ResultError` unless one ``samples.jsonl`` line `rec` has the expected types."""
    if not isinstance(rec, dict):
        raise ResultError(f"the record is {type_words(rec)}, expected an object")
    _check(rec, RECORD, "")
    sample_labels(rec)


CHECKS = {
    "result.json": check_result,
    "spec.json": check_spec,
    "ground_truth.json": check_ground_truth,
}


def check_files(files: Mapping[str, bytes]) -> None:
    """Check the pulled JSON files of an eval job parse and have the expected types."""
    docs = {}
    for name in CHECKS:
        if name in files:
            try:
                docs[name] = json.loads(files[name])
            except ValueError:
                raise ResultError(f"{name} is not valid JSON") from None
    result = docs.get("result.json")
    schema = result.get("schema") if isinstance(result, dict) else None
    if isinstance(schema, str) and schema.split("/")[0] != RESULT_SCHEMA.split("/")[0]:
        return
    for name, doc in docs.items():
        check = CHECKS[name]
        try:
            check(doc)
        except ResultError as exc:
            raise ResultError(f"{name}: {exc}") from None
    if "samples.jsonl" in files:
        for n, line in enumerate(files["samples.jsonl"].splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise ResultError(f"samples.jsonl line {n} is not valid JSON") from None
            try:
                check_record(rec)
            except ResultError as exc:
                raise ResultError(f"samples.jsonl line {n}: {exc}") from None
