"""The job document (``dflash.job/1``), typed: `JobSpec` reads it once, checking every part
with the contract's own checks: its kind, the engine's `EvalSpec` (``eval``), the
`GroundTruthSpec` and `Sampling` blocks, the selection (``samples``, ``seed``,
``thinking``), where to stop, the host's target-feature cache (``feature_cache``,
``feature_cache_gib``), and what a parity capture sets (the attention implementation, the
layers, the logits' top-k).

The controller builds the blocks from the same types (their ``to_json`` is the wire form)
and the inventory checks its settings with the same `Check`s (`JobSpec.CHECKS`,
`GroundTruthSpec.CHECKS`, `Sampling.CHECKS`), so a value one side accepts the other does.
A document setting is declared once (`setting`); one that a host's inventory eval role
sets is marked so, and the inventory and the job builder take it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from remote.protocol.eval_spec import EvalSpec
from remote.protocol.ground_truth import GroundTruthSpec, Sampling
from remote.protocol.jobs import JOB_KINDS, JobKind, check_job_id
from remote.protocol.ladder import RUNGS
from remote.protocol.values import (
    COUNT,
    FLAG,
    SHA256,
    TEXT,
    WHOLE,
    Check,
    SpecError,
    finite,
    is_int,
    one_of,
)

# The attention implementations a parity capture may run the target with (None:
# transformers' default for the architecture).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
ATTN = one_of(*ATTN_IMPLEMENTATIONS)
CAPTURE_TOPK = 8  # logits kept per token by a parity capture
# Where a job may stop early: after its ground truth (a sharded eval's first job).
STOP_AFTER = ("ground_truth",)
DEFAULT_WORKDIR = "~/.dflash"
# The eval host's cache of target features (`remote.eval.feature_cache`): its bound in GiB,
# 0 meaning this default, sized for a few evals' samples of a mid-size target (an 8B's
# five layers x 4096 wide x 2048 tokens in bf16: 84 MB a sample).
FEATURE_CACHE_DEFAULT_GIB = 16
FEATURE_CACHE_MAX_GIB = 2**20  # a PiB: beyond it a bound is not one
FEATURE_CACHE_GIB = Check(
    f"a number of GiB from 0 to {FEATURE_CACHE_MAX_GIB} "
    f"(0: the default, {FEATURE_CACHE_DEFAULT_GIB})",
    lambda v: finite(v) and 0 <= v <= FEATURE_CACHE_MAX_GIB,
)
# What ``job start`` adds to its runner's niceness, as ``nice -n`` does (a host whose eval
# shares the CPUs with a serving engine); a runner is never made less nice.
NICE = Check("a whole number from 0 to 19", lambda v: is_int(v) and 0 <= v <= 19)
LAYERS = Check(
    "a non-empty list of layer numbers from 0",
    lambda v: isinstance(v, list) and bool(v) and all(is_int(i) and i >= 0 for i in v),
)


def setting(default: Any, check: Check, label: str | None = None, role: bool = False) -> Any:
    """A setting of the job document, declared once: its `default`, its `check`, its name in
    a message (`label`, else its key) and whether a host's inventory eval role sets it
    (`role`: ``roles.eval.<key>``, checked by the same `check` and carried into every job
    built for that host)."""
    return field(default=default, metadata={"check": check, "label": label, "role": role})


@dataclass(frozen=True)
class JobSpec:
    """One job document as the host runs it. `kind` (`JOB_KINDS`); `engine`: its
    ``eval``; `ground_truth`, `sampling`; `samples` prompts chosen with `seed` (None:
    all), the chat template's `thinking`; `stop_after` (`STOP_AFTER`, None: the whole
    job); `prompts`: the prompts file on the host (its ``prompts.path``) and the sha256
    it must have (`prompts_sha256`, None: the host's own file, not checked); `workdir`,
    `job_id` (set by ``job start``); `feature_cache`: whether the eval reuses and keeps
    the target's features in the host's cache, bounded by `feature_cache_gib` (0: the
    default, `FEATURE_CACHE_DEFAULT_GIB`; see `feature_cache_bytes`); a parity capture's
    `attn`, `layers` (None: the drafter's target layers) and `topk`; `context_ladder`:
    the context lengths a ladder puts each prompt at (`remote.protocol.ladder`; None:
    the prompts as they are). `doc`: the document
    as it came, for what the host only records (host, checkpoint, created, the prompts
    entry, a compare job's folders). Built by `from_json`; every value is checked there."""

    kind: str = setting(JobKind.EVAL, one_of(*JOB_KINDS), "job kind")
    engine: EvalSpec = EvalSpec()
    ground_truth: GroundTruthSpec = GroundTruthSpec()
    sampling: Sampling = Sampling()
    samples: int | None = setting(None, COUNT)
    seed: int = setting(0, WHOLE)
    thinking: bool = setting(False, FLAG)
    stop_after: str | None = setting(None, one_of(*STOP_AFTER))
    prompts: str | None = None
    prompts_sha256: str | None = None
    workdir: str = setting(DEFAULT_WORKDIR, TEXT)
    job_id: str | None = None
    feature_cache: bool = setting(True, FLAG, "the feature cache switch")
    feature_cache_gib: float = setting(
        0, FEATURE_CACHE_GIB, "the feature cache's size (feature_cache_gib)", role=True
    )
    nice: int = setting(0, NICE, role=True)
    attn: str | None = setting(None, ATTN, "attention implementation")
    layers: tuple[int, ...] | None = setting(None, LAYERS)
    topk: int = setting(CAPTURE_TOPK, COUNT)
    context_ladder: tuple[int, ...] | None = setting(None, RUNGS)
    doc: dict = field(default_factory=dict, compare=False, repr=False)

    # Made from the `setting`s, below the class: the document's own settings (the blocks
    # check theirs) by key in the order checked, their names in a message, and those a
    # host's inventory eval role sets, with their defaults.
    CHECKS: ClassVar[dict[str, Check]]
    LABELS: ClassVar[dict[str, str]]
    ROLE_SETTINGS: ClassVar[dict[str, Any]]

    @classmethod
    def from_json(cls, doc: Any) -> JobSpec:
        """The job from its document; a bad value is a `SpecError` naming it (the host
        adds where it read it). Keys the host does not act on pass as they are."""
        if not isinstance(doc, dict):
            raise SpecError("a job spec must be a JSON object")
        try:
            engine = EvalSpec.of_job(doc)
        except TypeError as exc:  # a value of a type no setting takes
            raise SpecError(f"eval spec: {exc}") from None
        given = {n: cls.setting_in(doc, n) for n in cls.CHECKS if doc.get(n) is not None}
        prompts = doc.get("prompts")
        if prompts is not None and not (isinstance(prompts, dict) and TEXT(prompts.get("path"))):
            raise SpecError("the job's prompts must be a JSON object with a path")
        if prompts and prompts.get("sha256") is not None:
            given["prompts_sha256"] = SHA256.require("the prompts' sha256", prompts["sha256"])
        if doc.get("job_id") is not None:
            given["job_id"] = check_job_id(doc["job_id"])
        for name in ("layers", "context_ladder"):
            if name in given:
                given[name] = tuple(given[name])
        sampling = Sampling.from_json(doc.get("sampling"))
        return cls(
            **given,
            engine=engine_sampling(engine, sampling),
            ground_truth=GroundTruthSpec.from_json(doc.get("ground_truth")),
            sampling=sampling,
            prompts=prompts["path"] if prompts else None,
            doc=doc,
        )

    @classmethod
    def setting_in(cls, doc: dict, name: str) -> Any:
        """Setting `name` of the document `doc`, checked (absent or null: its default), for
        a step that needs it before the job is read whole (``job start``)."""
        value = doc.get(name)
        if value is None:
            return cls.__dataclass_fields__[name].default
        return cls.CHECKS[name].require(cls.LABELS[name], value)

    def feature_cache_bytes(self) -> int:
        """The feature cache's bound in bytes: 0 when this job does not use the cache."""
        if not self.feature_cache:
            return 0
        return int((self.feature_cache_gib or FEATURE_CACHE_DEFAULT_GIB) * 2**30)


def engine_sampling(engine: EvalSpec, sampling: Sampling) -> EvalSpec:
    """`engine` with the job's sampling (one truth: the ``sampling`` block): its
    temperature, top-k, top-p and seed; an ``eval`` that names others is a `SpecError`."""
    wanted = {**sampling.engine(), "seed": sampling.seed}
    for name, value in wanted.items():
        given = getattr(engine, name)
        if given != getattr(EvalSpec, name) and given != value:
            raise SpecError(
                f"the job's eval {name} {given} differs from its sampling's {value}: "
                "give it once, in sampling"
            )
    if engine.draft_policy != EvalSpec.draft_policy and not sampling.sampled:
        raise SpecError("--draft-policy applies above temperature 0 only (0 is greedy)")
    return replace(engine, **wanted)


_SETTINGS = [f for f in fields(JobSpec) if "check" in f.metadata]
JobSpec.CHECKS = {f.name: f.metadata["check"] for f in _SETTINGS}
JobSpec.LABELS = {f.name: f.metadata["label"] or f.name for f in _SETTINGS}
JobSpec.ROLE_SETTINGS = {f.name: f.default for f in _SETTINGS if f.metadata["role"]}
