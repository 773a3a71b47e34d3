"""What an ``online`` job serves with, defined once: `ServeSpec`, the job spec's ``serve``
entry. The controller builds it (from the inventory's ``roles.eval.serve`` or
``--server``) and the host reads it back with the same checks, so a value one side
accepts the other does too.

Two ways: ``python`` (the serving engine's own interpreter on the host: the job starts
its server on a free loopback port and stops it however the job ends) or ``url`` (a server
the team already runs with the drafter loaded: nothing is started). Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from remote.protocol.values import is_int, is_number

ENGINES = ("vllm", "sglang")
# The engines a job can start itself (SGLang's CPU DFlash is not released yet).
STARTABLE = ("vllm",)
DEFAULT_START_TIMEOUT = 900.0  # vLLM imports in ~15 s idle, 80 s+ on a loaded 2-core box
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
    """Why `url` cannot be a serving engine's address, or None (``http(s)://host[:port]``,
    no user, query or fragment)."""
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
    """The serving engine of one online measurement (see the module docstring).

    ``engine``: `ENGINES`; ``python``: its interpreter on the host (a job-started server);
    ``url``: an existing server; ``model``: the served model name to ask for (None: the
    server's only one); ``kv_cache_gib``: a started vLLM's KV cache
    (``VLLM_CPU_KVCACHE_SPACE``); ``start_timeout``/``request_timeout``: seconds for the
    server to answer ``/health``, and for one completion."""

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
        """The spec from its JSON object; unknown keys are an error (a typo never silently
        changes a run), null means the default."""
        if not isinstance(obj, dict):
            raise ServeError("an online job needs a 'serve' object (python or url)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ServeError(
                f"serve has unknown keys {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in obj.items() if v is not None})
