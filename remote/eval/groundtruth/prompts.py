"""The prompts of a ground truth: JSONL, a seeded selection, chat-template rendering."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from remote.errors import UserError
from remote.eval.provenance import file_sha256
from remote.protocol import SpecError, parse_prompts, prompt_lines, sample_labels


def read_jsonl(path: str, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; one-line UserErrors otherwise."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{n}: not valid JSON") from None


def load_prompts(
    path: str, samples: int | None = None, seed: int = 0, sha256: str | None = None
) -> list[dict]:
    """Prompt records from a JSONL file, a seeded subset; `sha256` refuses other content."""
    try:
        if sha256 is not None and file_sha256(path) != sha256:
            raise UserError(
                f"prompts file {path} is not the file the controller sent (its sha256 "
                "differs); run the eval again to send it anew"
            )
        with open(path, "rb") as fh:
            records = parse_prompts(prompt_lines(fh, path), path, Path(path).stem)
    except OSError as exc:
        raise UserError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    except SpecError as exc:
        raise UserError(str(exc)) from None
    return select(records, samples, seed)


def select(records: list, samples: int | None, seed: int) -> list:
    """`samples` records by a fixed seed, in order; stratified by ``category``."""
    if samples is None or samples >= len(records):
        return list(records)
    if samples < 1:
        raise UserError(f"--samples must be at least 1, got {samples}")
    rng = random.Random(seed)
    groups: dict = {}
    for i, r in enumerate(records):
        groups.setdefault(r.get("category"), []).append(i)
    if len(groups) == 1:
        keep = rng.sample(range(len(records)), samples)
    else:
        keep = stratified(list(groups.values()), samples, rng)
    return [records[i] for i in sorted(keep)]


def stratified(groups: list[list[int]], samples: int, rng: random.Random) -> list[int]:
    """Seeded indices from `groups`: one per group, the rest by size (largest remainders)."""
    if samples < len(groups):
        return [rng.choice(groups[g]) for g in rng.sample(range(len(groups)), samples)]
    rest, spare = samples - len(groups), sum(len(g) - 1 for g in groups)
    quotas = [rest * (len(g) - 1) / spare if spare else 0.0 for g in groups]
    take = [1 + int(q) for q in quotas]
    order = sorted(range(len(groups)), key=lambda g: (int(quotas[g]) - quotas[g], rng.random()))
    for g in order[: samples - sum(take)]:
        take[g] += 1
    return [i for g, n in zip(groups, take, strict=True) for i in rng.sample(g, n)]


def load_tokenizer(target: str):
    from transformers import AutoTokenizer

    from remote.model.files import no_tokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except Exception as exc:
        raise UserError(
            f"cannot load the target's tokenizer from {target}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if len(tokenizer) <= 1:  # transformers 5 builds an empty one from config.json alone
        raise UserError(no_tokenizer(target))
    return tokenizer


def render_prompt(tokenizer, prompt: str | dict, thinking: bool) -> tuple[str, list[int]]:
    """(text, ids) with the chat template; a record's ``messages`` win over ``text``."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = prompt.get("messages") or [{"role": "user", "content": prompt["text"]}]
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
    else:
        rendered = "\n\n".join(m["content"] for m in messages)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return rendered, list(ids)


def chat_template_sha256(tokenizer) -> str | None:
    """sha256 of the chat template applied (None: none), recorded to tell runs apart."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def labelled(prompt: dict) -> dict:
    """A prompt's id and labels as its ground-truth line and sample record carry them."""
    return {"id": prompt["id"], **sample_labels(prompt)}
