"""What an eval job will do, in one line, before it runs: its samples x the new tokens of
each, the dtype, the DDTree budgets and where its ground truth comes from. The library
hands it to the watching view as an ``outline`` event (``{"event": "outline", "text"}``),
which prints it above the bars, with or without a terminal."""

from __future__ import annotations

from typing import Any

from remote.protocol import GT_SOURCES, JOB_EVAL_KEY

# How many samples the outline suggests for a first look at a checkpoint, when the run
# takes every prompt of a larger set (what the demo evaluates).
FIRST_LOOK = 8


def _part(job: dict, key: str) -> dict:
    value = job.get(key)
    return value if isinstance(value, dict) else {}


def selection(job: dict) -> str:
    """``25 samples (all of chat)``, ``8 samples (of chat's 25, seed 0)``, or where the
    count is not known here (a prompts file on the host, a ground-truth file)."""
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
    """One line: what the eval job `job` (`spec.build_spec`'s) will do `where` (``job J on
    evalbox``, ``sharded eval R across a, b``)."""
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
