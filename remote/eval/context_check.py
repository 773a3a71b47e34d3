"""The contexts a job will reach and the drafter's window against them (docs/eval.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.model.window import check, text_config, window
from remote.protocol import GT_SOURCES, JobSpec
from remote.protocol.ladder import longest as ladder_longest

# a prompt of N bytes is at most N + this many tokens rendered, so only a passing bound is tokenised
TEMPLATE_SLACK = 256


def longest_context(job: JobSpec, target: str, reach: int | None) -> tuple[int, str] | None:
    """(longest context, how found), or None before a deferred ground truth."""
    new = job.sampling.max_new_tokens
    if job.context_ladder:
        return ladder_longest(job.context_ladder, new), "the ladder's top rung and completion"
    gt = job.ground_truth
    if not GT_SOURCES[gt.kind].reads_prompts:
        if gt.deferred is not None or not gt.path:
            return None
        return _file_longest(gt.path), "the ground-truth file's longest sample"
    from remote.eval.groundtruth.prompts import load_prompts

    records = load_prompts(job.prompts, job.samples, job.seed, job.prompts_sha256)
    bound = max(len(_text(r).encode()) for r in records) + TEMPLATE_SLACK + new
    if reach is None or bound <= reach:
        return bound, "at most: the longest prompt's bytes and max_new_tokens"
    from remote.eval.groundtruth.prompts import load_tokenizer, render_prompt

    tokenizer = load_tokenizer(target)
    ids = [render_prompt(tokenizer, r, job.thinking)[1] for r in records]
    return max(map(len, ids)) + new, "the longest rendered prompt and max_new_tokens"


def _text(record: dict) -> str:
    """All of a prompt record's text (a conversation's every message)."""
    if record.get("messages"):
        return "".join(m["content"] for m in record["messages"])
    return record["text"]


def _file_longest(path: str) -> int:
    longest = 0
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                longest = max(longest, len(row["prompt_ids"]) + len(row["completion_ids"]))
    return longest


def window_report(job: JobSpec, drafter: Path) -> dict[str, Any]:
    """``{window, longest_context, longest_from, warning}`` of the drafter."""
    try:
        cfg = json.loads((drafter / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    w = window(cfg)
    if job.context_ladder:
        target_reaches(
            job.engine.target, ladder_longest(job.context_ladder, job.sampling.max_new_tokens)
        )
    found = longest_context(job, job.engine.target, w.reach)
    out: dict[str, Any] = {"window": w.to_json(), "longest_context": None, "warning": None}
    if found is not None:
        out.update(longest_context=found[0], longest_from=found[1], warning=check(cfg, found[0]))
    return out


def target_reaches(target: str, longest: int) -> None:
    """Refuse a ladder whose contexts pass the target's own window."""
    try:
        cfg = text_config(json.loads((Path(target) / "config.json").read_text()))
    except (OSError, ValueError):
        return
    w = window(cfg)
    if w.reach is not None and longest > w.reach:
        raise UserError(
            f"the context ladder reaches {longest} tokens but the target's window is "
            f"{w.reach} ({w.describe()}); lower the ladder's top rung"
        )


def exact(raw: dict, longest: int) -> dict[str, Any]:
    """The check on the contexts the run did reach (the engine's, in the result)."""
    return {
        "window": window(raw).to_json(),
        "longest_context": longest,
        "warning": check(raw, longest),
    }
