"""The JSON types of ``verdict.json``, checked by the controller on pull and on read: a
host's verdict is its word, so every field read is checked here."""

from __future__ import annotations

import json
from typing import Any

from remote.online.verdict import SCHEMA
from remote.protocol.results import ResultError, check_doc, tau_types
from remote.protocol.values import FLAG, INT, NUM, SCALAR, STR, list_of

CAUSES = (
    "agree",
    "engine_answer_invalid",
    "not_lossless",
    "no_per_step_metrics",
    "drafter_not_loaded",
    "num_speculative_tokens",
    "dtype",
    "steps_without_draft",
    "engine_deviation",
    "engine_disagrees",
    "distribution_differs",
    "batch_changes_acceptance",
    "baseline_not_lossless",
)
DEVIATION_STATUS = ("confirmed", "not_reproduced", "not_applicable")
TAU = tau_types()
POSITIONS = list_of({"position": INT, "attempts": INT, "accepted": INT, "rate": NUM})
COUNTERS = {
    "drafts": INT,
    "draft_tokens": INT,
    "accepted": INT,
    "accepted_per_position": list_of(INT),
    "mean_acceptance_length": NUM,
}
ENGINE_COSTS = {
    "source": STR,
    "decode_s": NUM,
    "decode_tokens": INT,
    "verify_steps": INT,
    "time_per_output_token_s": NUM,
    "time_per_verify_step_s": NUM,
    "tokens_per_verify_step": NUM,
}
PAIR = list_of(NUM)
DISTRIBUTION = {
    "level": NUM,
    "samples": INT,
    "tokens": INT,
    "observed_rounds": INT,
    "expected_rounds": NUM,
    "rounds_interval": list_of(INT),
    "observed_tau": NUM,
    "expected_tau": NUM,
    "tau_interval": PAIR,
    "p_value": NUM,
    "agree": FLAG,
    "per_sample_mean": {"observed": NUM, "expected": NUM, "interval": PAIR},
    "samples_outside": INT,
    "per_sample": list_of(
        {
            "id": SCALAR,
            "tokens": INT,
            "observed_rounds": INT,
            "expected_rounds": NUM,
            "rounds_interval": list_of(INT),
            "expected_tau": NUM,
            "observed_tau": NUM,
            "p_value": NUM,
        }
    ),
}
SAMPLING = {"temperature": NUM, "top_k": INT, "top_p": NUM, "seed": INT, "draft_policy": STR}
SPEED = {"concurrency": INT, "seconds": NUM, "tokens": INT, "tokens_per_s": NUM, "lossless": INT}
VERDICT = {
    "schema": STR,
    "verdict": STR,
    "samples": INT,
    "block_size": INT,
    "num_spec_tokens": INT,
    "dtype": {"offline": STR, "online": STR},
    "offline": TAU,
    "online": TAU,
    "online_uncut_tau": NUM,
    "per_position": {"offline": POSITIONS, "online": POSITIONS},
    "lossless": {"samples": INT, "total": INT, "ok": FLAG},
    "rounds_equal": {"samples": INT, "total": INT},
    "per_sample": list_of(
        {
            "id": SCALAR,
            "lossless": FLAG,
            "first_wrong_token": INT,
            "rounds_equal": FLAG,
            "first_divergence": {
                "round": INT,
                "token": INT,
                "context": INT,
                "offline": INT,
                "online": INT,
            },
            "covered": FLAG,
            "offline_tau": NUM,
            "online_tau": NUM,
            "online_rounds": list_of(INT),
        }
    ),
    "by_context": list_of(
        {
            "context": INT,
            "diverged": INT,
            "offline_rounds": INT,
            "offline_tau": NUM,
            "online_rounds": INT,
            "online_tau": NUM,
        }
    ),
    "diagnosis": list_of({"cause": STR, "detail": STR}),
    "server": {
        "engine": STR,
        "started_here": FLAG,
        "url": STR,
        "startup_s": NUM,
        "seconds": NUM,
        "tokens": INT,
        "counters": COUNTERS,
        "counters_expected": COUNTERS,
        "counters_agree": FLAG,
        "version": STR,
        "platform": STR,
        "max_model_len": INT,
        "threads": INT,
        "threads_from": STR,
    },
    "engine_costs": ENGINE_COSTS,
    "invalid": list_of({"field": STR, "detail": STR}),
    "levels": list_of(
        {
            **SPEED,
            "tau_token_weighted": NUM,
            "tau_per_sample_mean": NUM,
            "rounds_equal": INT,
            "same_rounds_as_first": INT,
            "counters_agree": FLAG,
            "invalid": FLAG,
            "baseline_tokens_per_s": NUM,
            "speedup": NUM,
        }
    ),
    "baseline": {
        "started_here": FLAG,
        "url": STR,
        "startup_s": NUM,
        "levels": list_of(SPEED),
        "engine_costs": ENGINE_COSTS,
        "decode_speedup": NUM,
    },
    "deviations": list_of(
        {
            "name": STR,
            "engine": STR,
            "does": STR,
            "todo": STR,
            "status": STR,
            "why": STR,
            "tested": INT,
            "reproduced": INT,
        }
    ),
    "online_samples": list_of(
        {
            "id": SCALAR,
            "num_spec_tokens": INT,
            "num_spec_steps": INT,
            "mean_acceptance_length": NUM,
            "acceptance_histogram": list_of(INT),
            "per_step_accepted": list_of(INT),
            "per_step_drafted": list_of(INT),
            "finish_reason": STR,
        }
    ),
    "sampling": SAMPLING,
    "distribution": DISTRIBUTION,
    "created": NUM,
}
REQUIRED = ("schema", "verdict", "samples", "block_size", "offline", "lossless", "diagnosis")


def check_verdict(doc: Any) -> dict:
    """`doc` if it is an online verdict (types, fields, causes, counts that agree); else a
    `ResultError` naming the field."""
    if not isinstance(doc, dict):
        raise ResultError("the verdict is not a JSON object")
    missing = [k for k in REQUIRED if doc.get(k) is None]
    if missing:
        raise ResultError(f"{', '.join(missing)} missing")
    check_doc(doc, VERDICT)
    if doc["schema"] != SCHEMA:
        raise ResultError(f"schema is {doc['schema']!r}, expected {SCHEMA}")
    causes = [d.get("cause") for d in doc["diagnosis"]]
    unknown = [c for c in causes if c not in CAUSES]
    if not causes or unknown or doc["verdict"] != causes[0]:
        raise ResultError(
            f"verdict {doc['verdict']!r} / diagnosis {causes!r} is not a known cause "
            f"({', '.join(CAUSES)}) leading the diagnosis"
        )
    n = doc["samples"]
    rows = doc.get("per_sample") or []
    lossless, equal = doc["lossless"], doc.get("rounds_equal") or {}
    counts = [
        ("per_sample", len(rows), n),
        ("lossless.total", lossless.get("total"), n),
        ("lossless.samples", lossless.get("samples"), sum(bool(r.get("lossless")) for r in rows)),
    ]
    if equal.get("samples") is not None:
        same = sum(bool(r.get("rounds_equal")) for r in rows)
        counts.append(("rounds_equal.samples", equal["samples"], same))
    for name, got, want in counts:
        if got != want:
            raise ResultError(f"{name} is {got!r} but the verdict's samples say {want}")
    if lossless.get("ok") is not (lossless.get("samples") == n):
        raise ResultError("lossless.ok disagrees with its counts")
    if doc.get("invalid") and (doc.get("online") or doc.get("online_uncut_tau")) is not None:
        raise ResultError("an engine's invalid answer gives no online tau, yet this one has one")
    _check_engine_costs(doc.get("engine_costs") or {}, "engine_costs")
    _check_engine_costs(
        (doc.get("baseline") or {}).get("engine_costs") or {}, "baseline.engine_costs"
    )
    _check_levels(doc)
    _check_distribution(doc)
    for i, d in enumerate(doc.get("deviations") or []):
        status, tested, same = d.get("status"), d.get("tested") or 0, d.get("reproduced") or 0
        if status not in DEVIATION_STATUS or not 0 <= same <= tested:
            raise ResultError(f"deviations[{i}] is {status!r}, {same} of {tested}: not a result")
        if (status == "confirmed") != (tested > 0 and same == tested):
            raise ResultError(f"deviations[{i}] is {status} but reproduces {same} of {tested}")
    return doc


def _check_distribution(doc: dict) -> None:
    """A test whose p-value, level and agreement disagree, or a distribution verdict
    at temperature 0, is not a result."""
    d = doc.get("distribution")
    if d is None:
        return
    if not (doc.get("sampling") or {}).get("temperature"):
        raise ResultError("distribution is given without a temperature above 0 in sampling")
    p, level = d.get("p_value"), d.get("level")
    if p is None or level is None or not 0 <= p <= 1 or d.get("agree") is not (p > level):
        raise ResultError(f"distribution.agree is {d.get('agree')!r} for p {p!r}, level {level!r}")
    named = any(x.get("cause") == "distribution_differs" for x in doc["diagnosis"])
    if named == d["agree"]:
        raise ResultError("the diagnosis disagrees with distribution.agree")


def _check_levels(doc: dict) -> None:
    """Each level's (and the baseline's) tokens per second is its tokens over its seconds,
    its speedup its over the baseline's; levels ascend; every count within the samples."""
    n = doc["samples"]
    levels = doc.get("levels") or []
    base = (doc.get("baseline") or {}).get("levels") or []
    for where, rows in (("levels", levels), ("baseline.levels", base)):
        conc = [lv.get("concurrency") for lv in rows]
        if conc != sorted(set(conc)) or any((c or 0) < 1 for c in conc):
            raise ResultError(f"{where} concurrency {conc} is not ascending levels >= 1")
        for i, lv in enumerate(rows):
            tps, tokens, seconds = lv.get("tokens_per_s"), lv.get("tokens"), lv.get("seconds")
            if tps is not None and not (
                seconds and tokens is not None and _close(tps, tokens / seconds)
            ):
                raise ResultError(f"{where}[{i}].tokens_per_s is {tps!r}, not tokens / seconds")
            for key in ("lossless", "rounds_equal", "same_rounds_as_first"):
                if lv.get(key) is not None and not 0 <= lv[key] <= n:
                    raise ResultError(f"{where}[{i}].{key} is {lv[key]!r}, not 0..{n}")
    if base and [b.get("concurrency") for b in base] != [lv.get("concurrency") for lv in levels]:
        raise ResultError("baseline.levels are not the levels measured")
    for i, lv in enumerate(levels):
        sp, b = lv.get("speedup"), lv.get("baseline_tokens_per_s")
        if sp is not None and not (
            b and lv.get("tokens_per_s") and _close(sp, lv["tokens_per_s"] / b)
        ):
            raise ResultError(f"levels[{i}].speedup is {sp!r}, not tokens_per_s / baseline's")


def _check_engine_costs(costs: dict, where: str) -> None:
    """The engine's times are seconds >= 0, and its per-token and per-step times are its
    decode seconds over its tokens and steps."""
    for key in ("decode_s", "time_per_output_token_s", "time_per_verify_step_s"):
        if costs.get(key) is not None and costs[key] < 0:
            raise ResultError(f"{where}.{key} is {costs[key]!r}, not seconds >= 0")
    seconds = costs.get("decode_s")
    for key, over in (
        ("time_per_output_token_s", "decode_tokens"),
        ("time_per_verify_step_s", "verify_steps"),
    ):
        got, n = costs.get(key), costs.get(over)
        if got is not None and not (seconds is not None and n and _close(got, seconds / n)):
            raise ResultError(f"{where}.{key} is {got!r}, not decode_s / {over}")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 + 1e-6 * abs(b)


def check_verdict_bytes(data: bytes) -> dict:
    """`check_verdict` on a ``verdict.json`` as pulled."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise ResultError("verdict.json is not valid JSON") from None
    try:
        return check_verdict(doc)
    except ResultError as exc:
        raise ResultError(f"verdict.json: {exc}") from None
