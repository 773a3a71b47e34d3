"""What an eval job will do, in one line before it runs (an ``outline`` event)."""

from __future__ import annotations

from typing import Any

from remote.protocol import GT_SOURCES, JOB_EVAL_KEY

# Suggested for a first look when a run takes every prompt of a larger set.
FIRST_LOOK = 8


def _part(job: dict, key: str) -> dict:
    value = job.get(key)
    return value if isinstance(value, dict) else {}


def selection(job: dict) -> str:
    """Which samples, in words (``8 samples (of chat's 25, seed 0)``)."""
    prompts, samples = _part(job, "prompts"), job.get("samples")
    name = prompts.get("name") or "the prompts"
    count = prompts.get("count")
    if not prompts:
        gt = _part(job, "ground_truth")
        where = gt.get("path") or "the ground-truth file"
        return f"{samples} samples of {where}" if samples else f"every sample of {where}"
    if samples and count and samples < count:
        return f"{samples} samples (of {name}'s {count}, seed {job.get('seed', 0)})"
    if count:
        return f"{count} samples (all of {name})"
    return f"{samples} samples of {name}" if samples else f"every prompt of {name}"


def ground_truth_words(gt: dict) -> str:
    """Where the ground truth comes from, in words, from its kind's entry (`GT_SOURCES`)."""
    kind = GT_SOURCES.get(gt.get("kind"))
    if kind is None or kind.server:
        words = f"{gt.get('kind')} server {gt.get('url')}"
    elif kind.on_target:
        words = "the target's own greedy completions, made on the host"
    else:
        words = "from another host" if gt.get("deferred") else f"file {gt.get('path')}"
    if kind is None or kind.cached:
        words += " (made afresh)" if gt.get("fresh") else " (reused where cached on the host)"
    return words


def outline(job: dict, where: str) -> str:
    """One line: what eval job `job` will do `where` (``job J on evalbox``)."""
    engine = _part(job, JOB_EVAL_KEY)
    max_new = _part(job, "sampling").get("max_new_tokens")
    budgets = engine.get("budgets") or []
    trees = f"DDTree budgets {', '.join(map(str, budgets))}" if budgets else "no DDTree"
    line = (
        f"{where}: {selection(job)} x up to {max_new} new tokens, "
        f"{engine.get('dtype')}, {trees}; ground truth: "
        f"{ground_truth_words(_part(job, 'ground_truth'))}"
    )
    count = _part(job, "prompts").get("count")
    if job.get("samples") is None and isinstance(count, int) and count > FIRST_LOOK:
        line += f"; --samples {FIRST_LOOK} for a quicker first look"
    return line


def outline_event(job: dict, where: str) -> dict[str, Any]:
    """The ``outline`` event a view prints (`outline`)."""
    return {"event": "outline", "text": outline(job, where)}
