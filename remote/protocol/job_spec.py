"""The job document (``dflash.job/1``), typed: `JobSpec` reads it once, checking every part
with the contract's own checks: its kind, the engine's `EvalSpec` (``eval``), the
`GroundTruthSpec` and `Sampling` blocks, the selection (``samples``, ``seed``,
``thinking``), where to stop, the host's target-feature cache (``feature_cache``,
``feature_cache_gib``), and what a parity capture sets (the attention implementation, the
layers, the logits' top-k).

The controller builds the blocks from the same types (their ``to_json`` is the wire form)
and the inventory checks its settings with the same `Check`s (`JobSpec.CHECKS`,
`GroundTruthSpec.CHECKS`, `Sampling.CHECKS`), so a value one side accepts the other does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from remote.protocol.eval_spec import EvalSpec
from remote.protocol.ground_truth import GroundTruthSpec, Sampling
from remote.protocol.jobs import JOB_KINDS, JobKind, check_job_id
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
LAYERS = Check(
    "a non-empty list of layer numbers from 0",
    lambda v: isinstance(v, list) and bool(v) and all(is_int(i) and i >= 0 for i in v),
)


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
    `attn`, `layers` (None: the drafter's target layers) and `topk`. `doc`: the document
    as it came, for what the host only records (host, checkpoint, created, the prompts
    entry, a compare job's folders). Built by `from_json`; every value is checked there."""

    kind: str = JobKind.EVAL
    engine: EvalSpec = EvalSpec()
    ground_truth: GroundTruthSpec = GroundTruthSpec()
    sampling: Sampling = Sampling()
    samples: int | None = None
    seed: int = 0
    thinking: bool = False
    stop_after: str | None = None
    prompts: str | None = None
    prompts_sha256: str | None = None
    workdir: str = DEFAULT_WORKDIR
    job_id: str | None = None
    feature_cache: bool = True
    feature_cache_gib: float = 0
    attn: str | None = None
    layers: tuple[int, ...] | None = None
    topk: int = CAPTURE_TOPK
    doc: dict = field(default_factory=dict, compare=False, repr=False)

    # The document's own settings (the blocks check theirs), by key, in the order checked.
    CHECKS: ClassVar[dict[str, Check]] = {
        "kind": one_of(*JOB_KINDS),
        "samples": COUNT,
        "seed": WHOLE,
        "thinking": FLAG,
        "stop_after": one_of(*STOP_AFTER),
        "workdir": TEXT,
        "feature_cache": FLAG,
        "feature_cache_gib": FEATURE_CACHE_GIB,
        "attn": ATTN,
        "layers": LAYERS,
        "topk": COUNT,
    }
    LABELS: ClassVar[dict[str, str]] = {
        "kind": "job kind",
        "attn": "attention implementation",
        "feature_cache": "the feature cache switch",
        "feature_cache_gib": "the feature cache's size (feature_cache_gib)",
    }

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
        given = {}
        for name, check in cls.CHECKS.items():
            value = doc.get(name)
            if value is not None:
                given[name] = check.require(cls.LABELS.get(name, name), value)
        prompts = doc.get("prompts")
        if prompts is not None and not (isinstance(prompts, dict) and TEXT(prompts.get("path"))):
            raise SpecError("the job's prompts must be a JSON object with a path")
        if prompts and prompts.get("sha256") is not None:
            given["prompts_sha256"] = SHA256.require("the prompts' sha256", prompts["sha256"])
        if doc.get("job_id") is not None:
            given["job_id"] = check_job_id(doc["job_id"])
        if "layers" in given:
            given["layers"] = tuple(given["layers"])
        return cls(
            **given,
            engine=engine,
            ground_truth=GroundTruthSpec.from_json(doc.get("ground_truth")),
            sampling=Sampling.from_json(doc.get("sampling")),
            prompts=prompts["path"] if prompts else None,
            doc=doc,
        )

    def feature_cache_bytes(self) -> int:
        """The feature cache's bound in bytes: 0 when this job does not use the cache."""
        if not self.feature_cache:
            return 0
        return int((self.feature_cache_gib or FEATURE_CACHE_DEFAULT_GIB) * 2**30)
