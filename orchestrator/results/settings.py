"""How a run was made, as its folder records it: dtype, thinking mode, chat template,
engine, the target's features."""

from __future__ import annotations

from typing import Any

from orchestrator.results import store as res


def _part(run: res.Run, key: str) -> dict:
    value = run.spec.get(key)  # spec.json is a host's word: any JSON
    return value if isinstance(value, dict) else {}


def ground_truth_source(run: res.Run) -> dict:
    return res.ground_truth_source(run)


def target_features(run: res.Run) -> dict:
    """Where the run's target features came from (``inputs.target_features``: the host's
    cache or the target's forward); {} for a run that does not say."""
    got = (run.result.get("inputs") or {}).get("target_features")
    return got if isinstance(got, dict) else {}


def dtype(run: res.Run) -> Any:
    return (run.result.get("environment") or {}).get("dtype") or run.spec.get("dtype")


def thinking(run: res.Run) -> str | None:
    """``on`` or ``off``: whether the prompts were rendered with thinking on (the job's
    flag, else the one its ground truth recorded); None when neither says."""
    for doc in (run.spec, ground_truth_source(run)):
        if isinstance(doc.get("thinking"), bool):
            return "on" if doc["thinking"] else "off"
    return None


def chat_template(run: res.Run) -> str | None:
    """sha256 of the chat template the prompts were rendered with (the ground truth
    records it); None when there was none or it was not recorded."""
    return ground_truth_source(run).get("chat_template_sha256")


def engine(run: res.Run) -> str | None:
    """The eval engine that produced the result (the job records it in inputs.eval_engine)."""
    e = (run.result.get("inputs") or {}).get("eval_engine")
    if isinstance(e, dict):
        return e.get("name")
    return e or (run.result.get("environment") or {}).get("engine")
