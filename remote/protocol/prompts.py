"""A prompts file (JSONL) as both sides read it: one prompt a line, z-lab's
``{"turns": [...]}`` (its first turn), ``{"prompt": "..."}``, a whole conversation
``{"messages": [{"role", "content"}, ...]}`` ending with the user's turn (a long context
of your own, rendered with the target's chat template) or, already as the target's token
ids, ``{"prompt_ids": [...]}`` (a target without tokenizer files can then be prompted),
with an optional ``id`` and labels.

The controller checks a local file with `parse_prompts` before it pushes it; the host reads
it with the same function, so a file one side takes the other takes too."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from remote.protocol.results import ResultError, sample_labels
from remote.protocol.values import SpecError, is_int

# One prompt's line, in bytes: a 262k-token context is about 1 MiB of text; far beyond
# that a line is a mistake whose parse and tokenisation would run for minutes.
PROMPT_LINE_MAX_BYTES = 4 * 1024 * 1024


def prompt_lines(fh, where: str) -> Iterable[tuple[int, bytes]]:
    """(line number, line) of a binary file, no line read past `PROMPT_LINE_MAX_BYTES`."""
    n = 0
    while line := fh.readline(PROMPT_LINE_MAX_BYTES + 2):
        n += 1
        if len(line.rstrip(b"\r\n")) > PROMPT_LINE_MAX_BYTES:
            raise SpecError(
                f"{where}:{n}: the line is over {PROMPT_LINE_MAX_BYTES // 2**20} MiB; "
                "one prompt a line, each under that"
            )
        yield n, line


def parse_prompts(lines: Iterable[tuple[int, bytes]], where: str, stem: str) -> list[dict]:
    """Prompt records ``{"id", "text", labels...}`` (or ``{"id", "ids", labels...}`` for
    a line of token ids) from numbered JSONL lines; a `SpecError` naming the line
    otherwise. Ids are unique (an absent one is
    ``<stem>-<index>``): two records with one id would be one sample twice."""
    records: list[dict] = []
    seen: dict[str, int] = {}
    for n, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise SpecError(f"{where}:{n}: not valid JSON") from None
        record = _record(obj, f"{where}:{n}", f"{stem}-{len(records)}")
        if record["id"] in seen:
            raise SpecError(
                f"{where}:{n}: id {record['id']!r} is line {seen[record['id']]}'s too; "
                "give each prompt its own id"
            )
        seen[record["id"]] = n
        records.append(record)
    if not records:
        raise SpecError(f"prompts file {where} holds no prompts")
    return records


ROLES = ("system", "user", "assistant")


def _record(obj: Any, where: str, default_id: str) -> dict:
    turns = obj.get("turns") if isinstance(obj, dict) else None
    ids = obj.get("prompt_ids") if isinstance(obj, dict) else None
    messages = None
    if isinstance(obj, dict) and "messages" in obj:
        messages = conversation(obj["messages"], where)
        body: dict = {"text": messages[-1]["content"]}
    elif isinstance(turns, list) and turns and isinstance(turns[0], str):
        body = {"text": turns[0]}
    elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        body = {"text": obj["prompt"]}
    elif isinstance(ids, list) and ids and all(is_int(t) and t >= 0 for t in ids):
        body = {"ids": ids}
    elif ids is not None:
        raise SpecError(f"{where}: prompt_ids must be a non-empty list of token ids (from 0)")
    else:
        raise SpecError(
            f'{where}: expected {{"turns": ["..."]}}, {{"prompt": "..."}} or '
            '{"messages": [{"role": "user", "content": "..."}, ...]} or '
            '{"prompt_ids": [token ids]}'
        )
    try:
        labels = sample_labels(obj)
    except ResultError as exc:
        raise SpecError(f"{where}: {exc}") from None
    out = {"id": str(obj.get("id", default_id)), **body, **labels}
    return out | ({"messages": messages} if messages else {})


def token_ids_only(records: list[dict]) -> bool:
    """Whether every prompt record is given as token ids (no tokenizer needed)."""
    return all("ids" in r for r in records)


def conversation(messages: Any, where: str) -> list[dict]:
    """A conversation's messages, checked: each ``{"role", "content"}`` (roles `ROLES`, a
    system message only first), the user and the assistant taking turns, the user's the
    last (the turn whose completion is the ground truth)."""
    if not isinstance(messages, list) or not messages:
        raise SpecError(f"{where}: messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not (
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
        ):
            raise SpecError(
                f'{where}: message {i + 1} is not {{"role": "user"|"assistant"|"system", '
                '"content": "..."}'
            )
        out.append({"role": m["role"], "content": m["content"]})
    if any(m["role"] == "system" for m in out[1:]):
        raise SpecError(f"{where}: a system message may only come first")
    talk = [m["role"] for m in out if m["role"] != "system"]
    if talk[-1:] != ["user"] or any(a == b for a, b in zip(talk, talk[1:], strict=False)):
        raise SpecError(
            f"{where}: the user and the assistant take turns in messages, and the user's comes last"
        )
    return out
