"""Jobs on a host: ids, states, kinds, carried files, and the answers' JSON types."""

from __future__ import annotations

import re
from typing import Any

from remote.protocol.metrics import live
from remote.protocol.values import (
    ANY,
    ANY_TEXT,
    COUNT_FROM_0,
    FINITE,
    FLAG,
    OBJECT,
    WHOLE,
    Check,
    SpecError,
    is_int,
    json_type,
    list_of,
    one_of,
    shown,
)
from remote.relay.wire import name_problem

# Small files a job start carries in its spec, saving a round trip (docs/eval.md).
JOB_CARRY_KEY = "carry"
CARRY_DIRS = ("prompts", "groundtruth/shards")
CARRY_MAX_BYTES = 4 * 1024 * 1024
NAME_MAX_BYTES = 255  # one path component on Linux and macOS filesystems


def carried_name_problem(name: Any) -> str | None:
    """Why `name` cannot be a carried file's name, or None: the relay's `name_problem`, no
    control character or lone surrogate, at most `NAME_MAX_BYTES`; spaces are fine."""
    why = name_problem(name)
    if why:
        return why
    bad = next(
        (c for c in name if c < " " or "\x7f" <= c < "\xa0" or "\ud800" <= c <= "\udfff"), None
    )
    if bad is not None:
        return f"holds a control character or a lone surrogate (U+{ord(bad):04X})"
    if len(name.encode()) > NAME_MAX_BYTES:
        return f"is longer than {NAME_MAX_BYTES} bytes"
    return None


# Names the host's job folder AND the workstation's run folder: one path component.
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class JobState:
    """A job's states: ``starting`` (folder, no runner yet), ``running``, then a terminal one
    (``lost``: the runner died without saying how it ended)."""

    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"


JOB_STATES = (
    JobState.STARTING,
    JobState.RUNNING,
    JobState.DONE,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.LOST,
)
TERMINAL_STATES = (JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.LOST)


class JobKind:
    """What a job does: an eval, a parity capture or compare, an online measurement."""

    EVAL = "eval"
    CAPTURE = "parity-capture"
    COMPARE = "parity-compare"
    ONLINE = "online-measure"


JOB_KINDS = (JobKind.EVAL, JobKind.CAPTURE, JobKind.COMPARE, JobKind.ONLINE)
# The heartbeat tells a quiet job from a silent host.
WATCH_HEARTBEAT_SECONDS = 5.0
WATCH_END_EVENT = "watch_end"


class AnswerError(ValueError):
    """A host's job answer off the contract; names the field (the controller adds the host)."""


def check_job_id(value: object) -> str:
    """`value` if it is a job id (`JOB_ID_RE`, whole), else a SpecError saying why."""
    if not isinstance(value, str) or not JOB_ID_RE.fullmatch(value):
        raise SpecError(
            f"invalid job id {shown(value)} (up to 128 letters, digits, '.', '_', '-', "
            "starting with a letter or digit)"
        )
    return value


_FIELD_TYPES = {
    "id": Check("a job id", lambda v: isinstance(v, str) and bool(JOB_ID_RE.fullmatch(v))),
    "state": one_of(*JOB_STATES),
    "kind": one_of(*JOB_KINDS),
    "text": ANY_TEXT,
    "count": COUNT_FROM_0,
    "int": WHOLE,
    "number": FINITE,
    "bool": FLAG,
    "object": OBJECT,
    "list": list_of(ANY),
}
# Fields the controller reads ("?": may be absent or null); others pass as they are.
JOB_EXIT_FIELDS = {"state": "state", "code": "int?", "error": "text?", "finished": "number?"}
JOB_EVENT_FIELDS = {
    "event": "text",
    "time": "number?",
    "done": "count?",
    "total": "count?",
    "index": "count?",
    "samples": "count?",
    "tokens": "count?",
    "offset": "count?",
    "sample_tau": "number?",
    **{m.name: "number?" for m in live()},  # the registry's running values
    "seconds": "number?",
    "phase": "text?",
    "source": "text?",
    "message": "text?",
    "error": "text?",
    "cached": "bool?",
    "record": "object?",
    "state": "state?",
    "code": "int?",
}
JOB_STATUS_FIELDS = {
    "job_id": "id",
    "state": "state",
    "dir": "text",
    "kind": "kind?",
    "created": "number?",
    "checkpoint": "text?",
    "drafter": "text?",
    "pid": "count?",
    "pgid": "count?",
    "exit": "object?",
    "progress": "object?",
    "has_result": "bool",
}
JOB_ANSWER_FIELDS = {
    "start": {
        "job_id": "id",
        "dir": "text",
        "pid": "count",
        "pgid": "count",
        "starttime": "int?",
        "started": "number?",
        "preflight": "object?",
    },
    "status": JOB_STATUS_FIELDS,
    "pull": {**JOB_STATUS_FIELDS, "files": "object"},
    "cancel": {
        "job_id": "id",
        "state": "state",
        "was": "state",
        "killed": "count",
        "pgid": "count?",
    },
    "event": JOB_EVENT_FIELDS,
    "prune": {
        "workdir": "text",
        "dry_run": "bool",
        "older_than": "number",
        "entries": "list",
        "skipped": "list",
    },
    "watch_end": {
        "event": "text",
        "state": "state",
        "offset": "count",
        "exit": "object?",
        "has_result": "bool",
        "dir": "text",
        "files": "object?",
    },
}


PRUNE_ROW_FIELDS = {
    "entries": {
        "path": "text",
        "area": "text",
        "bytes": "count",
        "age": "number",
        "state": "state?",
    },
    "skipped": {"path": "text", "why": "text"},
}


def _check_fields(doc: object, fields: dict[str, str], path: str = "") -> dict:
    """`doc` if its `fields` have their types; `path` (``exit.``) prefixes the message."""
    if not isinstance(doc, dict):
        where = f"{path.rstrip('.')!r}" if path else "the answer"
        raise AnswerError(f"{where} is {json_type(doc)}, not a JSON object")
    for name, spec in fields.items():
        value = doc.get(name)
        if value is None:
            if spec.endswith("?"):
                continue
            raise AnswerError(f"{path + name!r} is missing")
        check = _FIELD_TYPES[spec.rstrip("?")]
        if not check(value):
            raise AnswerError(
                f"{path + name!r} is {json_type(value)} ({shown(value)}), expected {check.expected}"
            )
    return doc


def check_job_answer(action: str, doc: object) -> Any:
    """`doc`, a host's answer to ``job <action>`` or a ``job watch`` line (``event``,
    ``watch_end``), if each field read has its type; else an AnswerError naming it."""
    if action == "list":
        if not isinstance(doc, list):
            raise AnswerError(f"the answer is {json_type(doc)}, not a list of jobs")
        for i, row in enumerate(doc, 1):
            if not isinstance(row, dict):
                raise AnswerError(f"row {i} is {json_type(row)}, not a JSON object")
            try:
                check_job_answer("status", row)
            except AnswerError as exc:
                raise AnswerError(f"row {i}: {exc}") from None
        return doc
    _check_fields(doc, JOB_ANSWER_FIELDS[action])
    for rows, fields in (PRUNE_ROW_FIELDS if action == "prune" else {}).items():
        for i, row in enumerate(doc[rows], 1):
            _check_fields(row, fields, f"{rows}[{i}].")
    if doc.get("exit") is not None:
        _check_fields(doc["exit"], JOB_EXIT_FIELDS, "exit.")
    if doc.get("progress") is not None:
        _check_fields(doc["progress"], JOB_EVENT_FIELDS, "progress.")
    return doc


# How Slurm ended an array task's attempt, as ``job array-end`` tells its job folder.
_SLURM_END = {
    "job": re.compile(r"[1-9][0-9]{0,9}_(0|[1-9][0-9]{0,6})"),
    "state": re.compile(r"[A-Z_]{1,32}"),
    "nodes": re.compile(r"[A-Za-z0-9_.\[\],-]{0,1024}"),
    "why": re.compile(r"[\x20-\x7e]{1,512}"),
}


def check_slurm_end(doc: object) -> dict:
    """`doc` if it is a scheduler's end of an attempt, else a SpecError naming the field."""
    if not isinstance(doc, dict):
        raise SpecError(f"the attempt's end is {json_type(doc)}, not a JSON object")
    for name, pattern in _SLURM_END.items():
        value = doc.get(name)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise SpecError(f"the attempt's end: {name} {shown(value)} is not in its shape")
    code = doc.get("exit_code")
    if code is not None and not (is_int(code) and 0 <= code <= 255):
        raise SpecError(f"the attempt's end: exit_code {shown(code)} is not 0-255")
    return doc
