"""How the ground truth is decoded (`Sampling`, the job document's ``sampling``), what the
engine does with drafts under sampling (`DRAFT_POLICIES`), each completion's seed
(`request_seed`) and the check that a server sampled as it was asked
(`sampling_mismatch`). Greedy (temperature 0) is the default; docs/dflash-eval.md says
what tau at a temperature above 0 means and how dflash computes it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from remote.protocol.values import COUNT, COUNT_FROM_0, Check, SpecError, is_number

# Ground-truth completion length when neither the job nor the inventory sets one.
GT_DEFAULT_MAX_NEW_TOKENS = 256
MAX_TEMPERATURE = 100.0  # beyond this every distribution is flat: a typo, not a setting
# How the engine proposes drafts at a temperature above 0: the drafter's argmax (vLLM's
# default, ``draft_sample_method: greedy``, accepted with probability p(x)) or a draft
# sampled from the drafter at the temperature alone (vLLM's ``probabilistic``: no top-k
# or top-p on the draft; accepted with probability min(1, p(x)/q(x))).
DRAFT_POLICIES = ("argmax", "sample")
DEFAULT_DRAFT_POLICY = "argmax"
# The keys of a job's ``sampling`` that say whether decoding is greedy (and of what a
# server may report it used).
SAMPLING_KNOBS = ("temperature", "top_p", "top_k", "do_sample")

TEMPERATURE = Check(
    f"a number from 0 to {MAX_TEMPERATURE:g} (0: greedy)",
    lambda v: is_number(v) and math.isfinite(v) and 0 <= v <= MAX_TEMPERATURE,
)
TOP_P = Check(
    "a number above 0, at most 1", lambda v: is_number(v) and math.isfinite(v) and 0 < v <= 1
)
SEED = COUNT_FROM_0


def parse_temperatures(text: str | float | None) -> tuple[float, ...]:
    """Temperatures from ``0,0.6,1.0`` (a sweep) or one number, each `TEMPERATURE`, in the
    order given, without repeats; a bad one is a `SpecError`."""
    if text is None:
        return (0.0,)
    parts = [text] if is_number(text) else [p.strip() for p in str(text).split(",") if p.strip()]
    out: list[float] = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise SpecError(
                f"temperature {part!r} is not a number; e.g. 0.6 or 0,0.6,1.0"
            ) from None
        TEMPERATURE.require("temperature", value)
        if value not in out:
            out.append(value)
    if not out:
        raise SpecError("temperature: give one number, or several comma-separated (a sweep)")
    return tuple(out)


def request_seed(seed: int, prompt_id: str, index: int) -> int:
    """The seed of completion `index` of prompt `prompt_id` in a job seeded with `seed`:
    the same on every host, for every server and for local generation, so a completion
    can be made again; below 2**31 (what every server takes)."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}:{index}".encode()).hexdigest()
    return int(digest[:8], 16) & 0x7FFFFFFF


def completion_id(prompt_id: str, index: int) -> str:
    """A sampled completion's sample id: its prompt's and its index (``p7#2``)."""
    return f"{prompt_id}#{index}"


# What a sampled completion's ground-truth line (and so its sample record) says of it
# beside its id: the prompt it completes and its index among that prompt's completions.
COMPLETION_KEYS = ("prompt_id", "index")


def completion_keys(obj: dict) -> dict[str, Any]:
    """``prompt_id`` (text) and ``index`` (a whole number from 0) where `obj` has them,
    each checked (a `SpecError` naming it)."""
    out: dict[str, Any] = {}
    if obj.get("prompt_id") is not None:
        if not isinstance(obj["prompt_id"], str):
            raise SpecError("prompt_id must be text")
        out["prompt_id"] = obj["prompt_id"]
    if obj.get("index") is not None:
        out["index"] = COUNT_FROM_0.require("index", obj["index"])
    return out


@dataclass(frozen=True)
class Sampling:
    """How the ground truth is decoded (the job document's ``sampling``): at most
    `max_new_tokens` new tokens; greedily (`temperature` 0, the default), or sampled at
    `temperature` with `top_k` and `top_p` (None: off), `completions` per prompt, each
    with its own seed (`request_seed` of `seed`). Checked on construction (`CHECKS`);
    what only sampling takes, given at temperature 0, is refused in one line."""

    max_new_tokens: int = GT_DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    completions: int = 1

    CHECKS: ClassVar[dict[str, Check]] = {
        "max_new_tokens": COUNT,
        "temperature": TEMPERATURE,
        "top_k": COUNT,
        "top_p": TOP_P,
        "seed": SEED,
        "completions": COUNT,
    }
    # The flag that sets each, in a refusal's words.
    FLAGS: ClassVar[dict[str, str]] = {
        "max_new_tokens": "--max-new-tokens",
        "temperature": "--temperature",
        "top_k": "--top-k",
        "top_p": "--top-p",
        "seed": "--seed",
        "completions": "--gt-samples",
    }

    def __post_init__(self) -> None:
        for name, check in self.CHECKS.items():
            value = getattr(self, name)
            if value is not None:
                check.require(name, value)
        object.__setattr__(self, "temperature", float(self.temperature))
        if self.top_p == 1:
            object.__setattr__(self, "top_p", None)  # all of the mass: no cut
        if not self.sampled:
            given = [self.FLAGS[k] for k in ("top_k", "top_p") if getattr(self, k) is not None]
            given += [self.FLAGS["completions"]] if self.completions != 1 else []
            if given:
                raise SpecError(
                    f"{', '.join(given)} apply to sampled ground truth only: give "
                    "--temperature above 0 (at 0 every completion is the greedy one)"
                )

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    def to_json(self) -> dict[str, Any]:
        """The wire form (and the ground-truth cache key's part): greedy decoding as it
        always was, sampling with every setting that makes a completion."""
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
        }
        if self.sampled:
            out.update(
                top_k=self.top_k, top_p=self.top_p, seed=self.seed, completions=self.completions
            )
        return out

    def engine(self) -> dict[str, Any]:
        """What the eval engine applies to the target's distribution (`EvalSpec`)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    @classmethod
    def from_json(cls, obj: Any) -> Sampling:
        """The entry from its JSON object (absent or null: the defaults; a null value is
        its default). ``do_sample`` may say how to decode too (true needs a temperature
        above 0); other keys are an error."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise SpecError("the job's sampling must be a JSON object")
        allowed = (*cls.CHECKS, "do_sample")
        unknown = sorted(set(obj) - set(allowed))
        if unknown:
            raise SpecError(
                f"the job's sampling has unknown keys {', '.join(map(str, unknown))}; "
                f"allowed: {', '.join(allowed)}"
            )
        given = {k: v for k, v in obj.items() if v is not None and k != "do_sample"}
        if obj.get("do_sample") is True and not (
            is_number(given.get("temperature")) and given["temperature"] > 0
        ):
            raise SpecError("do_sample true needs a temperature above 0")
        return cls(**given)


def asked(sampling: dict) -> dict[str, Any]:
    """The decoding a request asked for, in the words servers report it (`SAMPLING_KNOBS`;
    top-k and top-p off as None), from a `Sampling.to_json`."""
    t = float(sampling.get("temperature") or 0.0)
    return {
        "temperature": t,
        "top_k": sampling.get("top_k") if t > 0 else None,
        "top_p": sampling.get("top_p") if t > 0 else None,
        "do_sample": t > 0,
    }


def _reported(key: str, value: Any) -> Any:
    """A reported knob in `asked`'s terms: top-k 0 or -1 and top-p 1 are off (None)."""
    if key == "top_k" and is_number(value) and value <= 0:
        return None
    if key == "top_p" and is_number(value) and value >= 1:
        return None
    if key == "temperature" and is_number(value):
        return float(value)
    return value


def sampling_mismatch(reported: dict, sampling: dict) -> dict | None:
    """The knobs a server reports (`reported`: any of `SAMPLING_KNOBS`) that differ from
    what `sampling` asked, as ``{knob: (reported, asked)}``; None when none does (greedy
    asked: temperature 0, or top-k 1, means greedy whatever else is reported)."""
    want = asked(sampling)
    got = {k: _reported(k, v) for k, v in reported.items() if k in SAMPLING_KNOBS}
    if not want["do_sample"]:
        greedy = got.get("temperature", 0.0) == 0.0 or got.get("top_k") == 1
        if got.get("do_sample") is True:
            greedy = False
        return None if greedy else {k: (v, want[k]) for k, v in got.items() if v != want[k]}
    differ = {}
    for key, value in got.items():
        if (
            key == "temperature"
            and is_number(value)
            and math.isclose(value, want[key], rel_tol=1e-6)
        ):
            continue
        if value != want[key]:
            differ[key] = (value, want[key])
    return differ or None
