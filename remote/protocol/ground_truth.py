"""Ground truth: its source kinds, the bounds on waiting for it (`GTLimits`), and the
judgement that a ground truth is wrong wholesale (`agreement_suspect`, `flag_suspect`)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from remote.protocol.values import SpecError, is_number

# Where ground truth comes from: a serving engine (SGLang's native API, an OpenAI-compatible
# one with token ids, one with text only), a file of ids on the host, or the target itself.
SERVER_KINDS = ("sglang", "openai", "openai-text")
GT_KINDS = (*SERVER_KINDS, "file", "local")
DEFAULT_GT_KIND = "sglang"  # when neither the job nor the inventory names one
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
    return is_number(rate) and rate < GT_SUSPECT_AGREEMENT


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
