"""Ground truth: where a job's comes from (`GroundTruthSpec`, its kinds in `gt_sources`),
the bounds on waiting for it (`GTLimits`), and the judgement that a ground truth is wrong
wholesale (`agreement_suspect`, `flag_suspect`). How it is decoded: `remote.protocol.sampling`."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from remote.protocol.gt_sources import GT_KINDS, GT_SOURCES, SourceKind, kind_for
from remote.protocol.sampling import GT_DEFAULT_MAX_NEW_TOKENS as GT_DEFAULT_MAX_NEW_TOKENS
from remote.protocol.sampling import Sampling as Sampling
from remote.protocol.values import COUNT, FLAG, TEXT, Check, SpecError, is_number, one_of

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
# Target agreement (the eval host's argmax equal to the ground-truth token, teacher-forced)
# below which the ground truth is taken to be wrong wholesale: flagged in the result and
# dropped from the host's cache. The target's own greedy completion agrees everywhere but
# at near-ties its numerics break otherwise (bf16 against a float32 server: 0.97 on the
# demo's tiny random models, real models higher); another model's or another prompt's ids
# agree on a fraction (in-vocabulary garbage: about 1/vocab).
GT_SUSPECT_AGREEMENT = 0.5
# A cache entry's name on the host (``<workdir>/groundtruth/<key>.jsonl``, and ``.json``).
GT_CACHE_KEY_RE = re.compile(r"^[0-9a-f]{24}$")


# What a bound in seconds must be, on either side (a job's entry, the command line, the
# inventory).
SECONDS = Check(
    f"a number of seconds above 0, at most {GT_MAX_SECONDS:.0f} (30 days)",
    lambda v: is_number(v) and 0 < v <= GT_MAX_SECONDS,  # false for NaN too
)


@dataclass(frozen=True)
class GTLimits:
    """The three bounds on waiting for ground truth (see `GT_DEFAULT_TIMEOUT`), in seconds:
    each `SECONDS` (above 0, at most `GT_MAX_SECONDS`), checked on construction (a
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
        for name, label in self.LABELS.items():
            value = SECONDS.require(f"the ground-truth {label}", getattr(self, name))
            object.__setattr__(self, name, float(value))

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class GroundTruthSpec:
    """Where a job's ground truth comes from (the job document's ``ground_truth``): its
    `kind` (`GT_KINDS`; none given: `kind_for` what it names, so a server URL alone is
    asked as the default server kind and nothing at all is made by the target on the
    host), the server's `url` or the host's file `path`, the served `model`
    to ask for (None: the server's own), the bounds on waiting for it (`limits`), requests
    in flight at once (`concurrency`), `fresh` (make it again instead of reusing the host's
    cached entry) and, for a ``file`` that arrives after the job starts, how many seconds
    it waits for it (`deferred`; see `GT_DEFERRED_FILE`).

    Every value is checked on construction by `CHECKS` (a `SpecError` naming it, in the
    host's words `LABELS`; the command line and the inventory name the same checks their
    own way). Whether the source is there (`missing_source`) is asked where it is needed:
    a job that makes no ground truth needs none."""

    kind: str | None = None
    url: str | None = None
    path: str | None = None
    model: str | None = None
    limits: GTLimits = GTLimits()
    concurrency: int = GT_DEFAULT_CONCURRENCY
    fresh: bool = False
    deferred: float | None = None

    CHECKS: ClassVar[dict[str, Check]] = {
        "kind": one_of(*GT_KINDS),
        "url": TEXT,
        "path": TEXT,
        "model": TEXT,
        **dict.fromkeys(GTLimits.LABELS, SECONDS),
        "concurrency": COUNT,
        "fresh": FLAG,
        "deferred": SECONDS,
    }
    LABELS: ClassVar[dict[str, str]] = {
        "kind": "ground truth kind",
        "url": "the ground-truth URL",
        "path": "the ground-truth file",
        "model": "the ground-truth model",
        **{name: f"the ground-truth {label}" for name, label in GTLimits.LABELS.items()},
        "concurrency": "the ground-truth concurrency",
        "fresh": "the ground-truth 'fresh'",
        "deferred": "the deferred ground truth's wait",
    }

    def __post_init__(self) -> None:
        if self.kind is None:
            object.__setattr__(self, "kind", kind_for({"url": self.url, "path": self.path}).name)
        for name in ("kind", "concurrency", "fresh"):
            self.CHECKS[name].require(self.LABELS[name], getattr(self, name))
        for name in ("url", "path", "model", "deferred"):
            if getattr(self, name) is not None:
                self.CHECKS[name].require(self.LABELS[name], getattr(self, name))
        if not isinstance(self.limits, GTLimits):
            raise SpecError("the ground-truth limits must be a GTLimits")

    @property
    def source(self) -> SourceKind:
        """The kind, as the contract describes it (`gt_sources`)."""
        return GT_SOURCES[self.kind]

    def missing_source(self) -> str | None:
        """Why this ground truth cannot be made (a server kind without a URL, a file
        without a path that is not deferred), or None."""
        if self.source.server and not self.url:
            return (
                f"ground truth kind {self.kind!r} needs a server URL: set "
                "roles.eval.ground_truth in the inventory or pass --ground-truth (or "
                "use ground_truth_kind local: the target makes it on the eval host)"
            )
        if self.source.needs == "path" and not self.path and self.deferred is None:
            return f"ground truth kind {self.kind!r} needs --ground-truth PATH (on the host)"
        return None

    def awaits_file(self) -> bool:
        """Whether the job waits for its ground-truth file to arrive (`GT_DEFERRED_FILE`)."""
        return self.source.needs == "path" and self.deferred is not None

    def to_json(self) -> dict[str, Any]:
        """The job document's ``ground_truth`` entry (what `from_json` reads back): the
        bounds flat beside the kind, ``fresh`` only when set, the source by its key."""
        out: dict[str, Any] = {
            "kind": self.kind,
            **self.limits.to_json(),
            "concurrency": self.concurrency,
            "model": self.model,
        }
        if self.fresh:
            out["fresh"] = True
        for name in ("path", "url", "deferred"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> GroundTruthSpec:
        """The entry from its JSON object (absent or null: the defaults; a null value is
        its default too); unknown keys are an error, so a typo never changes a run."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise SpecError("the job's ground_truth must be a JSON object")
        unknown = sorted(set(obj) - set(cls.CHECKS))
        if unknown:
            raise SpecError(
                f"the job's ground_truth has unknown keys {', '.join(map(str, unknown))}; "
                f"allowed: {', '.join(cls.CHECKS)}"
            )
        given = {k: v for k, v in obj.items() if v is not None}
        bounds = {k: given.pop(k) for k in GTLimits.LABELS if k in given}
        return cls(**given, limits=GTLimits(**bounds))


def agreement_suspect(rate: Any, sampled: bool = False) -> bool:
    """Whether a target agreement rate says the ground truth is wrong wholesale (see
    `GT_SUSPECT_AGREEMENT`); a missing rate (no tokens) says nothing, and neither does
    the rate of a `sampled` ground truth (it leaves the target's argmax by design)."""
    return not sampled and is_number(rate) and rate < GT_SUSPECT_AGREEMENT


def flag_suspect(info: dict, rate: float, evicted: bool) -> dict:
    """A ground truth's info (a job's ``ground_truth.json``) flagged as wrong wholesale at
    target agreement `rate` (`agreement_suspect`): ``suspect`` (agreement, threshold,
    ``evicted``: whether its cache entry was dropped) and one more warning saying so. The
    same words whichever side judged it (the job, or a sharded eval's controller)."""
    where = info.get("url") or info.get("path") or f"{info.get('kind')} generation"
    if evicted:
        fate = "dropped from the host's cache (the next eval makes it again)"
    elif not getattr(GT_SOURCES.get(str(info.get("kind"))), "cached", True):
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
