"""What the controller (`orchestrator/`) and a host (`remote/`) must agree on, defined ONCE.

Standard library only: the controller imports this module without torch, and a host runs
it inside the bundle. Both sides validate what they receive with the same functions, so a
value the controller accepts is one the host accepts, in the same words.

- the relay's names on a host (`MANIFEST`, `PARTIAL_PREFIX`, `REPAIR_PREFIX`) and its frame
  format on the wire (`FRAME_HEADER`: an 8-byte big-endian length before each payload),
  defined in `remote.relay.wire` and re-exported here;
- the schema names of the documents that cross (`JOB_SPEC_SCHEMA`, `RESULT_SCHEMA`,
  `PROBE_SCHEMA`, `MANIFEST_FORMAT`);
- the JSON types of an eval's result files (``result.json``, ``spec.json``,
  ``ground_truth.json``, ``samples.jsonl``), defined in `remote.result_doc` and re-exported
  here: `check_files` on what a host sends, the others on what a run folder holds;
- `EvalSpec`: what the eval engine evaluates and how, with ONE dtype vocabulary
  (``bfloat16``/``float32``; ``bf16``/``fp32`` are accepted once, at parse) and one set of
  defaults. A bad value is a `SpecError` (a ValueError with one line saying what to do);
  each side turns it into its own user error.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

# The relay's names on a host and its frame header live in remote.relay.wire (os and
# struct only, what the relay's host commands import instead of this module's dataclasses
# and typing: ~15 ms of each one's start); re-exported here, the same objects.
from remote.relay.wire import FRAME_HEADER as FRAME_HEADER
from remote.relay.wire import MANIFEST as MANIFEST
from remote.relay.wire import PARTIAL_PREFIX as PARTIAL_PREFIX
from remote.relay.wire import REPAIR_PREFIX as REPAIR_PREFIX
from remote.relay.wire import name_problem
from remote.result_doc import ResultError as ResultError
from remote.result_doc import check_files as check_files
from remote.result_doc import check_ground_truth as check_ground_truth
from remote.result_doc import check_record as check_record
from remote.result_doc import check_result as check_result
from remote.result_doc import check_spec as check_spec
from remote.result_doc import metrics_of as metrics_of
from remote.result_doc import sample_labels as sample_labels

# ---- relay ------------------------------------------------------------------------------

MANIFEST_FORMAT = "dflash-manifest/1"

# ---- schemas ----------------------------------------------------------------------------

JOB_SPEC_SCHEMA = "dflash.job/1"  # the engine's EvalSpec travels in it under JOB_EVAL_KEY
JOB_EVAL_KEY = "eval"
RESULT_SCHEMA = "dflash.eval/1"
PROBE_SCHEMA = "dflash.probe/1"
PARITY_SCHEMA = "dflash.parity/1"  # the compare job's result.json
PARITY_CAPTURE_SCHEMA = "dflash.parity-capture/1"  # one host's capture, A to B over the relay
# Files a finished job leaves in its folder that travel back with its result (the only
# names the controller writes).
RESULT_FILES = (
    "result.json",
    "samples.jsonl",
    "spec.json",
    "eval_spec.json",
    "ground_truth.json",
    "exit.json",
    "events.jsonl",
    "log.txt",
)

# Small input files a job start carries inside its spec (under JOB_CARRY_KEY: a list of
# ``{"path", "sha256", "data"}``, data base64), so that pushing them costs no round trip of
# its own: ``job start`` writes each one, content-addressed, before it spawns the runner,
# and drops the list from the spec it keeps. Only under these folders of the host's
# workdir, and only files up to CARRY_MAX_BYTES (bigger ones are pushed on their own).
JOB_CARRY_KEY = "carry"
CARRY_DIRS = ("prompts", "groundtruth/shards")
CARRY_MAX_BYTES = 4 * 1024 * 1024
NAME_MAX_BYTES = 255  # one path component on Linux and macOS filesystems


def carried_name_problem(name: Any) -> str | None:
    """Why `name` cannot be a carried file's name (one component inside a `CARRY_DIRS`
    folder), or None. The relay's rule for a checkpoint name (`remote.relay.wire.
    name_problem`: not empty, no '/', no '.' or '..', no NUL or line break), and, because it
    is named after a user's own file and becomes a file the job reads: no control character
    or lone surrogate anywhere, at most `NAME_MAX_BYTES` bytes in UTF-8. Spaces,
    parentheses and any other printable character (``mt bench (v2).jsonl``) are fine."""
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


# ---- jobs -------------------------------------------------------------------------------

# A job's id names its folder on the host AND the run folder it is pulled into on the
# workstation: one path component (never "." or ".."), checked by `check_job_id` on both.
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
JOB_STATES = ("starting", "running", "done", "failed", "cancelled", "lost")
TERMINAL_STATES = ("done", "failed", "cancelled", "lost")
JOB_KINDS = ("eval", "parity-capture", "parity-compare")
# ``job watch`` sends a heartbeat line at least this often, so a watcher can tell a quiet
# job from a host that went silent; its last line is a WATCH_END_EVENT (with --pull:
# carrying the result files).
WATCH_HEARTBEAT_SECONDS = 5.0
WATCH_END_EVENT = "watch_end"


class AnswerError(ValueError):
    """A host's job answer that is not what the contract says; the message names the field
    (the controller adds the host)."""


def check_job_id(value: object) -> str:
    """`value` if it is a job id (`JOB_ID_RE`, whole), else a SpecError saying why."""
    if not isinstance(value, str) or not JOB_ID_RE.fullmatch(value):
        raise SpecError(
            f"invalid job id {_shown(value)} (up to 128 letters, digits, '.', '_', '-', "
            "starting with a letter or digit)"
        )
    return value


def _shown(value: object) -> str:
    return reprlib.repr(value)  # bounded however big the value is


def _json_type(value: object) -> str:
    for kinds, name in (
        (bool, "true/false"),
        (dict, "a JSON object"),
        (list, "a list"),
        (str, "text"),
        ((int, float), "a number"),
    ):
        if isinstance(value, kinds):
            return name
    return "null" if value is None else type(value).__name__


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# What each field type of a job answer accepts, and how a message names it.
_FIELD_TYPES = {
    "id": (lambda v: isinstance(v, str) and bool(JOB_ID_RE.fullmatch(v)), "a job id"),
    "state": (lambda v: isinstance(v, str) and v in JOB_STATES, "one of " + ", ".join(JOB_STATES)),
    "kind": (lambda v: isinstance(v, str) and v in JOB_KINDS, "one of " + ", ".join(JOB_KINDS)),
    "text": (lambda v: isinstance(v, str), "text"),
    "count": (lambda v: _is_int(v) and v >= 0, "a whole number of at least 0"),
    "int": (lambda v: _is_int(v), "a whole number"),
    "number": (_finite, "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
}
# The fields of each job answer the controller reads, by type ("?": may be absent or null).
# Other fields pass as they are.
JOB_EXIT_FIELDS = {"state": "state", "code": "int?", "error": "text?", "finished": "number?"}
JOB_EVENT_FIELDS = {
    "event": "text",
    "time": "number?",
    "done": "count?",
    "total": "count?",
    "samples": "count?",
    "tokens": "count?",
    "offset": "count?",
    "tau": "number?",
    "sample_tau": "number?",
    "tau_token_weighted": "number?",
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


def _check_fields(doc: object, fields: dict[str, str], path: str = "") -> dict:
    """`doc` if it is an object whose `fields` have their types; `path`: where it sits in
    the answer (``exit.``), for the message."""
    if not isinstance(doc, dict):
        where = f"{path.rstrip('.')!r}" if path else "the answer"
        raise AnswerError(f"{where} is {_json_type(doc)}, not a JSON object")
    for name, spec in fields.items():
        value = doc.get(name)
        if value is None:
            if spec.endswith("?"):
                continue
            raise AnswerError(f"{path + name!r} is missing")
        test, expected = _FIELD_TYPES[spec.rstrip("?")]
        if not test(value):
            raise AnswerError(
                f"{path + name!r} is {_json_type(value)} ({_shown(value)}), expected {expected}"
            )
    return doc


def check_job_answer(action: str, doc: object) -> Any:
    """`doc`, a host's answer to ``job <action>`` (``start``, ``status``, ``pull``,
    ``cancel``, ``list``) or one line of ``job watch`` (``event``, ``watch_end``), if every
    field the controller reads has its type (`JOB_ANSWER_FIELDS`; an exit record's
    `JOB_EXIT_FIELDS`, a progress event's `JOB_EVENT_FIELDS`); else an AnswerError naming
    the field (``row 3: 'state' is a list ...``)."""
    if action == "list":
        if not isinstance(doc, list):
            raise AnswerError(f"the answer is {_json_type(doc)}, not a list of jobs")
        for i, row in enumerate(doc, 1):
            if not isinstance(row, dict):
                raise AnswerError(f"row {i} is {_json_type(row)}, not a JSON object")
            try:
                check_job_answer("status", row)
            except AnswerError as exc:
                raise AnswerError(f"row {i}: {exc}") from None
        return doc
    _check_fields(doc, JOB_ANSWER_FIELDS[action])
    if doc.get("exit") is not None:
        _check_fields(doc["exit"], JOB_EXIT_FIELDS, "exit.")
    if doc.get("progress") is not None:
        _check_fields(doc["progress"], JOB_EVENT_FIELDS, "progress.")
    return doc


# ---- ground truth -----------------------------------------------------------------------

GT_KINDS = ("sglang", "openai", "openai-text", "file", "local")
# A ``file`` ground truth may be DEFERRED (``{"kind": "file", "deferred": seconds}``): the
# job starts (imports, checks, loads its target) before its file exists, and waits up to
# that many seconds for it to arrive in its own folder under this name. A sharded eval
# starts its shards so while the ground truth is still being made, then pushes each slice.
GT_DEFERRED_FILE = "ground_truth.in.jsonl"
# How long the eval host waits on a ground-truth server, three bounds (a job's
# ``ground_truth`` entry: ``timeout``, ``deadline``, ``phase_deadline``; `GTLimits`):
# silence on one socket read; one request from connect to its answer's last byte (a server
# trickling bytes never trips the first); the whole phase, every request and the local
# generation together.
GT_DEFAULT_TIMEOUT = 300.0
# A request of max_new_tokens on a loaded serving engine takes seconds to a few minutes.
GT_DEFAULT_DEADLINE = 1800.0
# A safety net, not a budget: hours of generation is a local target on a CPU host.
GT_DEFAULT_PHASE_DEADLINE = 86400.0
GT_MAX_SECONDS = 30 * 86400.0  # beyond this a bound is not one (and timers overflow)
# Requests in flight at once to a ground-truth server: serving engines batch concurrent
# requests, so 16 prompts cost about what one does.
GT_DEFAULT_CONCURRENCY = 16
# Ground-truth completion length when neither the job nor the inventory sets one.
GT_DEFAULT_MAX_NEW_TOKENS = 256
# Target agreement (the eval host's argmax equal to the ground-truth token, teacher-forced)
# below which the ground truth is taken to be wrong wholesale: flagged in the result and
# dropped from the host's cache. The target's own greedy completion agrees everywhere but
# at near-ties its numerics break otherwise (bf16 against a float32 server: 0.97 on the
# demo's tiny random models, real models higher); another model's or another prompt's ids
# agree on a fraction (in-vocabulary garbage: about 1/vocab).
GT_SUSPECT_AGREEMENT = 0.5
# A cache entry's name on the host (``<workdir>/groundtruth/<key>.jsonl``, and ``.json``).
GT_CACHE_KEY_RE = re.compile(r"^[0-9a-f]{24}$")


@dataclass(frozen=True)
class GTLimits:
    """The three bounds on waiting for ground truth (see `GT_DEFAULT_TIMEOUT`), in seconds:
    each a number above 0 and at most `GT_MAX_SECONDS`, checked on construction (a
    `SpecError` naming the bound otherwise)."""

    timeout: float = GT_DEFAULT_TIMEOUT
    deadline: float = GT_DEFAULT_DEADLINE
    phase_deadline: float = GT_DEFAULT_PHASE_DEADLINE

    LABELS: ClassVar[dict[str, str]] = {
        "timeout": "timeout (seconds of silence)",
        "deadline": "deadline (seconds per request)",
        "phase_deadline": "phase deadline (seconds for the whole phase)",
    }

    def __post_init__(self) -> None:
        for name in self.LABELS:
            _set_seconds(self, name, getattr(self, name))

    @classmethod
    def of(cls, gt: Any) -> GTLimits:
        """The bounds a job's ``ground_truth`` entry sets (absent or null: the default)."""
        gt = gt if isinstance(gt, dict) else {}
        return cls(**{k: gt[k] for k in cls.LABELS if gt.get(k) is not None})

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def gt_seconds_problem(value: Any) -> str | None:
    """Why `value` cannot be a ground-truth bound in seconds, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is not a number of seconds ({value!r})"
    if not 0 < value <= GT_MAX_SECONDS:  # false for NaN too
        return f"must be above 0 and at most {GT_MAX_SECONDS:.0f} (30 days), got {value!r}"
    return None


def _set_seconds(limits: GTLimits, name: str, value: Any) -> None:
    problem = gt_seconds_problem(value)
    if problem:
        raise SpecError(f"the ground-truth {GTLimits.LABELS[name]} {problem}")
    object.__setattr__(limits, name, float(value))


def agreement_suspect(rate: Any) -> bool:
    """Whether a target agreement rate says the ground truth is wrong wholesale (see
    `GT_SUSPECT_AGREEMENT`); a missing rate (no tokens) says nothing."""
    return (
        isinstance(rate, (int, float))
        and not isinstance(rate, bool)
        and rate < GT_SUSPECT_AGREEMENT
    )


def flag_suspect(info: dict, rate: float, evicted: bool) -> dict:
    """A ground truth's info (a job's ``ground_truth.json``) flagged as wrong wholesale at
    target agreement `rate` (`agreement_suspect`): ``suspect`` (agreement, threshold,
    ``evicted``: whether its cache entry was dropped) and one more warning saying so. The
    same words whichever side judged it (the job, or a sharded eval's controller)."""
    where = info.get("url") or info.get("path") or f"{info.get('kind')} generation"
    if evicted:
        fate = "dropped from the host's cache (the next eval makes it again)"
    elif info.get("kind") == "file":
        fate = "it is a file given to the eval: make it again"
    else:
        fate = "its cache entry could not be dropped: remake it with --fresh-ground-truth"
    warning = (
        f"target agreement {rate:.0%} with the ground truth from {where}, far below the "
        f"{GT_SUSPECT_AGREEMENT:.0%} that this target's own greedy completions give: those "
        "ids are not its completions (another model, mixed-up prompts, a broken server), so "
        f"this eval's numbers mean nothing; {fate}"
    )
    return {
        **info,
        "suspect": {"agreement": rate, "threshold": GT_SUSPECT_AGREEMENT, "evicted": evicted},
        "warnings": [*(info.get("warnings") or []), warning],
    }


# ---- the eval spec ----------------------------------------------------------------------

DTYPES = ("bfloat16", "float32")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32"}
DEFAULT_DTYPE = "bfloat16"
DEFAULT_BUDGETS = (8, 16, 32, 64)
POSITIONS = ("all", "walk")
# Where the engine computes (remote.eval.device resolves it against what torch sees).
DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class SpecError(ValueError):
    """A value no eval can run with; the message is one line saying what to use instead."""


def parse_dtype(value: str | None) -> str | None:
    """``bfloat16``/``float32`` (``bf16``/``fp32``, any case, mean the same); None stays
    None; anything else is a SpecError."""
    if value is None:
        return None
    key = str(value).lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise SpecError(f"dtype {value!r} is not supported; use bfloat16 (bf16) or float32 (fp32)")
    return key


def parse_budgets(
    values: Iterable[Any] | str | None, *, allow_empty: bool = True
) -> tuple[int, ...]:
    """DDTree node budgets, sorted and without repeats: whole numbers of at least 1, given as
    a list or as comma-separated text (``8,16,32``)."""
    if values is None:
        values = ()
    if isinstance(values, str):
        parts = [p.strip() for p in values.split(",") if p.strip()]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise SpecError(f"budgets expects comma-separated integers, got {values!r}") from None
    values = list(values)
    if not all(_is_int(b) and b >= 1 for b in values) or (not values and not allow_empty):
        raise SpecError(
            f"budgets must be whole numbers of at least 1, got "
            f"{','.join(map(str, values)) or 'none'}"
        )
    return tuple(sorted(set(values)))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        raise SpecError(f"{name} must be a whole number of at least 1, got {value!r}")


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation as the engine runs it (``remote.eval.engine``).

    ``target``/``drafter``/``ground_truth``/``output_dir`` are paths on the host, filled in
    by the job there; ``budgets`` are the DDTree node budgets (none: chain walk only),
    ``topk`` the per-depth candidates (None: the budget), ``max_samples`` the first N
    ground-truth samples (None: all), ``block_chunk`` blocks per batched drafter call
    (None: sized to memory), ``positions`` ``all`` (a block at every completion position,
    for per-position acceptance over all of them) or ``walk`` (blocks only where rounds
    start, the samples in lockstep; the same rounds, fewer rows, but more and smaller
    drafter calls: benchmarks/eval_drafter_share.py found it no cheaper yet). Values are
    normalised and checked on construction, so every EvalSpec is a valid one.
    """

    target: str = ""
    drafter: str = ""
    ground_truth: str = ""
    output_dir: str = ""
    dtype: str = DEFAULT_DTYPE
    threads: int | None = None
    budgets: tuple[int, ...] = ()
    topk: int | None = None
    max_samples: int | None = None
    block_chunk: int | None = None
    positions: str = "all"
    device: str = "cpu"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "dtype", parse_dtype(self.dtype) or DEFAULT_DTYPE)
        set_(self, "budgets", parse_budgets(self.budgets))
        for name in ("threads", "topk", "max_samples", "block_chunk"):
            _positive_or_none(name, getattr(self, name))
        if not isinstance(self.device, str) or not DEVICE_RE.match(self.device):
            raise SpecError(f"device {self.device!r} is not supported; use cpu, cuda or cuda:N")
        if self.positions not in POSITIONS:
            raise SpecError(f'positions {self.positions!r} is not supported; use "all" or "walk"')
        for name in ("target", "drafter", "ground_truth", "output_dir"):
            if not isinstance(getattr(self, name), str):
                raise SpecError(f"{name} must be a path")

    def to_json(self) -> dict[str, Any]:
        """The spec as a JSON object (the wire form `from_json` reads back)."""
        out = asdict(self)
        out["budgets"] = list(self.budgets)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> EvalSpec:
        """The spec from its JSON object; unknown keys are an error, so a typo never
        silently changes a run."""
        if not isinstance(obj, dict):
            raise SpecError("an eval spec must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise SpecError(
                f"spec has unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        if obj.get("budgets") is not None and not isinstance(obj["budgets"], list):
            raise SpecError("budgets must be a list of positive integers, e.g. [8, 32, 64]")
        # null means the default, as an absent key does
        return cls(**{k: v for k, v in obj.items() if v is not None})

    @classmethod
    def of_job(cls, job: Any) -> EvalSpec:
        """The spec a job document (``dflash.job/1``) carries under ``eval``: the target,
        drafter and every engine setting, read once by the host that runs the job."""
        if not isinstance(job, dict):
            raise SpecError("a job spec must be a JSON object")
        return cls.from_json(job.get(JOB_EVAL_KEY) or {})


# What a job evaluates with when its caller chose nothing: DDTree at every default budget.
# (A bare engine spec, as `remote.eval.engine` reads it, walks the chain only.)
JOB_ENGINE_DEFAULT = EvalSpec(budgets=DEFAULT_BUDGETS)
