"""What an ``online`` job serves with and how it measures, defined once for both sides
(docs/online.md, "The serving engine")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from remote.protocol.values import is_int, is_number

ENGINES = ("vllm", "sglang")
STARTABLE = ("vllm",)
DEFAULT_START_TIMEOUT = 900.0  # vLLM's import is slow on a loaded host
DEFAULT_REQUEST_TIMEOUT = 600.0
DEFAULT_KV_CACHE_GIB = 4  # whole GiB: vLLM reads VLLM_CPU_KVCACHE_SPACE with int()


class ServeError(ValueError):
    """A ``serve`` entry no job can run with; one line saying what to set."""


def _seconds(name: str, value: Any) -> float:
    if not is_number(value):
        raise ServeError(f"serve.{name} must be a number of seconds, got {value!r}")
    if not (0 < value <= 86400 and math.isfinite(value)):
        raise ServeError(f"serve.{name} must be above 0 and at most 86400, got {value!r}")
    return float(value)


def url_problem(url: Any) -> str | None:
    """Why `url` cannot be a serving engine's address, or None."""
    if not isinstance(url, str) or not url:
        return "is not a URL"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a bad port raises here)
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "needs http:// or https:// and a host"
    if parts.username or parts.query or parts.fragment:
        return "may not carry a user, a query or a fragment"
    return None


@dataclass(frozen=True)
class ServeSpec:
    """The job spec's ``serve``: ``python`` (a server the job starts) or ``url`` (one
    already running)."""

    engine: str = "vllm"
    python: str | None = None
    url: str | None = None
    model: str | None = None
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB
    start_timeout: float = DEFAULT_START_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ServeError(f"serve.engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if (self.python is None) == (self.url is None):
            raise ServeError("serve needs exactly one of python (start a server) or url")
        if self.python is not None:
            if not isinstance(self.python, str) or not self.python.startswith(("/", "~")):
                raise ServeError(
                    f"serve.python {self.python!r} must be an absolute path on the host "
                    "(e.g. /opt/vllm/bin/python)"
                )
            if self.engine not in STARTABLE:
                raise ServeError(
                    f"serve.engine {self.engine} cannot be started by dflash; run it with the "
                    "drafter loaded and give its url (serve.url or --server URL)"
                )
        if self.url is not None and url_problem(self.url):
            raise ServeError(f"serve.url {self.url!r} {url_problem(self.url)}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ServeError("serve.model must be a served model name")
        kv = self.kv_cache_gib
        if not is_int(kv) or not 0 < kv <= 4096:
            raise ServeError(f"serve.kv_cache_gib must be a whole number of GiB, got {kv!r}")
        for name in ("start_timeout", "request_timeout"):
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> ServeSpec:
        """The spec from JSON; an unknown key is an error, null the default."""
        if not isinstance(obj, dict):
            raise ServeError("an online job needs a 'serve' object (python or url)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ServeError(
                f"serve has unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in obj.items() if v is not None})


MAX_CONCURRENCY = 256


@dataclass(frozen=True)
class MeasureSpec:
    """The job spec's ``measure``: the concurrency levels, and the baseline server
    started (``baseline_python``) or running (``baseline_url``)."""

    concurrency: tuple[int, ...] = (1,)
    baseline_python: str | None = None
    baseline_url: str | None = None

    def __post_init__(self) -> None:
        levels = self.concurrency
        if (
            not isinstance(levels, (list, tuple))
            or not levels
            or not all(is_int(c) and 1 <= c <= MAX_CONCURRENCY for c in levels)
            or list(levels) != sorted(set(levels))
        ):
            raise ServeError(
                f"concurrency must be ascending whole numbers 1..{MAX_CONCURRENCY} "
                f"(e.g. 1,4,16), got {levels!r}"
            )
        object.__setattr__(self, "concurrency", tuple(levels))
        if self.baseline_python is not None and self.baseline_url is not None:
            raise ServeError("a baseline is started (python) or already running (url), not both")
        py = self.baseline_python
        if py is not None and (not isinstance(py, str) or not py.startswith(("/", "~"))):
            raise ServeError(f"baseline python {py!r} must be an absolute path on the host")
        if self.baseline_url is not None and url_problem(self.baseline_url):
            raise ServeError(f"baseline url {self.baseline_url!r} {url_problem(self.baseline_url)}")

    @property
    def baseline(self) -> bool:
        return self.baseline_python is not None or self.baseline_url is not None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "concurrency": list(self.concurrency)}

    @classmethod
    def from_json(cls, obj: Any) -> MeasureSpec:
        """The entry from JSON (None: the defaults); an unknown key is an error."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise ServeError("an online job's 'measure' must be an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ServeError(f"measure has unknown keys {', '.join(unknown)}")
        return cls(**{k: v for k, v in obj.items() if v is not None})


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` as concurrency levels, ascending and each once; one line when not."""
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ServeError(
            f"--concurrency {text!r} is not a list of whole numbers (e.g. 1,4,16)"
        ) from None
    try:
        return MeasureSpec(concurrency=tuple(levels)).concurrency
    except ServeError as exc:
        raise ServeError(f"--concurrency {text!r}: {exc}") from None


def sampled_problem(temperature: float, engine: str, measure: MeasureSpec) -> str | None:
    """Why an online measurement at `temperature` cannot run as asked; None when it can."""
    if temperature <= 0:
        return None
    if engine != "vllm":
        return f"--temperature above 0 is measured on vLLM only; {engine}'s client decodes greedily"
    if len(measure.concurrency) > 1:
        return (
            "--concurrency with several levels compares each level's rounds with the first's, "
            "at temperature 0 only; give one level"
        )
    if measure.baseline:
        return "--baseline checks the target alone against the ground truth: temperature 0 only"
    return None
