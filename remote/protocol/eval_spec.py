"""`EvalSpec`: what the eval engine evaluates and how, with ONE dtype vocabulary and one set
of defaults, checked on construction."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from remote.protocol.sampling import DEFAULT_DRAFT_POLICY, DRAFT_POLICIES, SEED, TEMPERATURE, TOP_P
from remote.protocol.schemas import JOB_EVAL_KEY
from remote.protocol.values import COUNT, SpecError, is_int, one_of

DTYPES = ("bfloat16", "float32")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32"}
DEFAULT_DTYPE = "bfloat16"
DEFAULT_BUDGETS = (8, 16, 32, 64)
POSITIONS = ("all", "walk")
# Where the engine computes (remote.eval.device resolves it against what torch sees).
# What a host's python needs to run the engine (an eval, a parity capture): the eval host's
# preflight checks them, `hosts check` shows them missing where a role needs them.
ENGINE_PACKAGES = ("torch", "transformers", "safetensors")
DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


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
    if not all(is_int(b) and b >= 1 for b in values) or (not values and not allow_empty):
        raise SpecError(
            f"budgets must be whole numbers of at least 1, got "
            f"{','.join(map(str, values)) or 'none'}"
        )
    return tuple(sorted(set(values)))


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None:
        COUNT.require(name, value)


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation as the engine runs it (``remote.eval.engine``).

    ``target``/``drafter``/``ground_truth``/``output_dir`` are paths on the host, filled in
    by the job there; ``budgets`` are the DDTree node budgets (none: chain walk only),
    ``topk`` the per-depth candidates (None: the budget), ``max_samples`` the first N
    ground-truth samples (None: all), ``block_chunk`` blocks per batched drafter call
    (None: sized to memory), ``positions`` ``walk`` (the default: blocks only where
    rounds start, the samples in lockstep, per-position acceptance over the chain walk's
    round starts) or ``all`` (a block at every completion position too, for per-position
    acceptance over all of them; the same rounds, more drafting:
    benchmarks/eval_drafter_share.py). ``temperature``, ``top_k``, ``top_p``: how the
    ground truth was sampled and the engine samples (0: greedy; a job fills them from its
    ``sampling``); ``draft_policy`` (`DRAFT_POLICIES`) how drafts are proposed above 0,
    and ``seed`` the seed of the walks drawn there (docs/dflash-eval.md). Values are
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
    positions: str = "walk"
    device: str = "cpu"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    draft_policy: str = DEFAULT_DRAFT_POLICY
    seed: int = 0

    # The sampling settings, checked here and left out of the wire form at their defaults
    # (a greedy spec reads as it always did).
    SAMPLING = {
        "temperature": TEMPERATURE,
        "top_k": COUNT,
        "top_p": TOP_P,
        "draft_policy": one_of(*DRAFT_POLICIES),
        "seed": SEED,
    }

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
        for name, check in self.SAMPLING.items():
            if getattr(self, name) is not None:
                check.require(name.replace("_", "-"), getattr(self, name))
        set_(self, "temperature", float(self.temperature))

    @property
    def sampled(self) -> bool:
        """Whether the ground truth is sampled (a temperature above 0)."""
        return self.temperature > 0

    def to_json(self) -> dict[str, Any]:
        """The spec as a JSON object (the wire form `from_json` reads back); the sampling
        settings only where they differ from their defaults."""
        out = asdict(self)
        out["budgets"] = list(self.budgets)
        for name in self.SAMPLING:
            if out[name] == getattr(EvalSpec, name):
                del out[name]
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
