"""vLLM's speculative-decoding acceptance per request and around a run, each answer checked
before use (docs/online.md, "What vLLM reports"); an unknown shape is refused."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from remote.errors import UserError
from remote.httpclient import answer_bytes, http_json
from remote.online import counters as server_counters
from remote.online.invalid import SPEC, InvalidAnswer, steps_fit, totals_fit
from remote.protocol import Sampling, is_int, is_number, request_seed

ROLE = server_counters.ROLE
SPEC_FIELDS = (
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
    "mean_acceptance_length",
)


# ---- one completion -----------------------------------------------------------------------


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(is_int(x) for x in v)


@dataclass(frozen=True)
class SpecDecoding:
    """One request's acceptance as the server reports it; per-step arrays None at the
    ``summary`` level."""

    num_spec_tokens: int
    histogram: list[int]
    num_draft_tokens: int
    mean_acceptance_length: float
    accepted: list[int] | None
    drafted: list[int] | None

    @property
    def steps(self) -> int:
        return sum(self.histogram)

    @property
    def num_accepted(self) -> int:
        return sum(j * n for j, n in enumerate(self.histogram))


@dataclass(frozen=True)
class Completion:
    """One greedy completion: its ids, its acceptance, or why that could not be true."""

    token_ids: list[int]
    finish_reason: str | None
    spec: SpecDecoding | None
    invalid: InvalidAnswer | None = None


def spec_decoding(obj: Any, where: str) -> SpecDecoding:
    """Validate ``metrics.speculative_decoding``: shapes (`UserError`), then the counts'
    agreement with each other (`InvalidAnswer`)."""
    f = f"{where} metrics.speculative_decoding"
    if not isinstance(obj, dict):
        raise UserError(f"{f} is {type(obj).__name__}, not an object")
    missing = [k for k in SPEC_FIELDS if k not in obj]
    if missing:
        raise UserError(f"{f} lacks {', '.join(missing)}; is this vLLM 0.32 or later?")
    k, hist = obj["num_spec_tokens"], obj["acceptance_histogram"]
    if not is_int(k) or k < 1:
        raise UserError(f"{f}.num_spec_tokens is {k!r}, not a positive integer")
    if not _int_list(hist) or len(hist) != k + 1:
        raise UserError(
            f"{f}.acceptance_histogram is {hist!r}, not {k + 1} counts (0..{k} accepted)"
        )
    for name in ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"):
        if not is_int(obj[name]):
            raise UserError(f"{f}.{name} is {obj[name]!r}, not an integer")
    mean = obj["mean_acceptance_length"]
    if not is_number(mean):
        raise UserError(f"{f}.mean_acceptance_length is {mean!r}, not a number")
    per_acc, per_drafted = obj.get("per_step_accepted"), obj.get("per_step_drafted")
    if (per_acc is None) != (per_drafted is None):
        raise UserError(f"{f} has one of per_step_accepted / per_step_drafted without the other")
    steps, accepted = sum(hist), sum(j * n for j, n in enumerate(hist))
    if per_acc is not None:
        for name, v in (("per_step_accepted", per_acc), ("per_step_drafted", per_drafted)):
            if not _int_list(v) or len(v) != steps:
                raise UserError(f"{f}.{name} is not {steps} integers (one per verify step)")
    if min(hist) < 0:
        raise InvalidAnswer(f"{SPEC}.acceptance_histogram", f"{f}.acceptance_histogram is {hist!r}")
    for name, want in (("num_spec_steps", steps), ("num_accepted_draft_tokens", accepted)):
        if obj[name] != want:
            raise InvalidAnswer(
                f"{SPEC}.{name}", f"{f}.{name} is {obj[name]!r} but its histogram says {want}"
            )
    drafts = obj["num_draft_tokens"]
    if not accepted <= drafts <= k * steps:
        raise InvalidAnswer(
            f"{SPEC}.num_draft_tokens",
            f"{f}.num_draft_tokens is {drafts!r}, outside {accepted}..{k * steps} "
            "(accepted..k x steps)",
        )
    want_mean = 1.0 + accepted / steps if steps else 1.0
    if not math.isclose(mean, want_mean, abs_tol=1e-6):
        raise InvalidAnswer(
            f"{SPEC}.mean_acceptance_length",
            f"{f}.mean_acceptance_length is {mean!r}, its histogram says {want_mean}",
        )
    if per_acc is not None:
        steps_ok = (0 <= a <= d <= k for a, d in zip(per_acc, per_drafted, strict=True))
        bad = next((i for i, ok in enumerate(steps_ok) if not ok), None)
        if bad is not None:
            raise InvalidAnswer(
                f"{SPEC}.per_step_accepted",
                f"{f} step {bad} accepted {per_acc[bad]} of {per_drafted[bad]} drafted "
                f"tokens (k = {k})",
            )
        if sum(per_drafted) != drafts or [per_acc.count(j) for j in range(k + 1)] != hist:
            raise InvalidAnswer(
                f"{SPEC}.per_step_accepted", f"{f} per-step arrays disagree with its totals"
            )
    return SpecDecoding(k, list(hist), drafts, float(mean), per_acc, per_drafted)


def parse_completion(
    answer: Any, where: str, prompt_ids: list[int], max_tokens: int, vocab: int
) -> Completion:
    """Validate a ``/v1/completions`` answer for one token-id prompt; impossible counts
    become the completion's `invalid`, its ids still read."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise UserError(f"{where} answered without exactly one choice in 'choices'")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not _int_list(ids):
        raise UserError(
            f"{where} choices[0].token_ids is not a list of token ids; it needs "
            "return_token_ids support (vLLM 0.10.2 or later)"
        )
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise UserError(
            f"{where} choices[0].token_ids holds {bad}, outside the target's vocabulary "
            f"(0..{vocab - 1}); is it serving another model?"
        )
    if len(ids) != max_tokens:
        raise UserError(
            f"{where} choices[0].token_ids has {len(ids)} ids for max_tokens {max_tokens} "
            "with ignore_eos; did it stop early?"
        )
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and echoed != prompt_ids:
        raise UserError(
            f"{where} choices[0].prompt_token_ids differ from the prompt sent "
            f"({len(echoed) if isinstance(echoed, list) else echoed!r} ids back for "
            f"{len(prompt_ids)}); it does not take token-id prompts as given"
        )
    metrics = answer.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise UserError(f"{where} metrics is {type(metrics).__name__}, not an object")
    raw = (metrics or {}).get("speculative_decoding")
    finish = choice.get("finish_reason")
    spec, invalid = None, None
    if raw is not None:
        try:
            spec = spec_decoding(raw, where)
            if spec.accepted is not None:
                steps_fit(spec.accepted, max_tokens, where)
            else:
                totals_fit(spec.steps, spec.num_accepted, spec.num_spec_tokens, max_tokens, where)
        except InvalidAnswer as exc:
            spec, invalid = None, exc
    return Completion(list(ids), finish if isinstance(finish, str) else None, spec, invalid)


def completions_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1/completions") else url + "/v1/completions"


def complete(
    url: str,
    prompt_ids: list[int],
    max_tokens: int,
    vocab: int,
    *,
    model: str | None = None,
    timeout: float = 300.0,
    params: dict[str, Any] | None = None,
) -> Completion:
    """One completion of exactly ``max_tokens`` tokens, validated: greedy, or sampled
    with `params` (`sampling_params`)."""
    where = completions_url(url)
    payload = {
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        **(params or {"temperature": 0.0}),
        "ignore_eos": True,
        "n": 1,
        "return_token_ids": True,
    }
    if model:
        payload["model"] = model
    bound = answer_bytes(len(prompt_ids), max_tokens)
    answer = http_json(where, payload, timeout, max_bytes=bound, role=ROLE)
    return parse_completion(answer, where, prompt_ids, max_tokens, vocab)


def sampling_params(sampling: Sampling | None, row: dict) -> dict[str, Any]:
    """A request's sampling: greedy, or `sampling`'s with the row's own seed."""
    if sampling is None or not sampling.sampled:
        return {"temperature": 0.0}
    seed = request_seed(sampling.seed, row.get("prompt_id", row["id"]), row.get("index", 0))
    out: dict[str, Any] = {"temperature": sampling.temperature, "seed": seed}
    out.update({k: v for k, v in (("top_k", sampling.top_k), ("top_p", sampling.top_p)) if v})
    return out


# ---- a run --------------------------------------------------------------------------------


def _record(row: dict, c: Completion) -> dict[str, Any]:
    """A completion as `remote.online.verdict.compare` reads it (ids and acceptance)."""
    s = c.spec
    return {
        "id": row["id"],
        "token_ids": c.token_ids,
        "finish_reason": c.finish_reason,
        "num_spec_tokens": None if s is None else s.num_spec_tokens,
        "mean_acceptance_length": None if s is None else s.mean_acceptance_length,
        "num_spec_steps": None if s is None else s.steps,
        "acceptance_histogram": None if s is None else s.histogram,
        "per_step_accepted": None if s is None else s.accepted,
        "per_step_drafted": None if s is None else s.drafted,
    }


def measure(
    url: str,
    rows: list[dict],
    vocab: int,
    *,
    model: str | None = None,
    timeout: float = 300.0,
    concurrency: int = 1,
    on_done: Callable[[int, int], None] | None = None,
    settle_s: float = server_counters.SETTLE_SECONDS,
    sampling: Sampling | None = None,
) -> dict[str, Any]:
    """Each ground-truth prompt, `concurrency` in flight, for exactly its completion's
    length (greedy, or at `sampling` with per-request seeds), with the server's counters
    and decode time read around the run; ``invalid``:
    each impossible count found (the run is then not a measurement)."""
    from remote.online import engine_time

    where = server_counters.metrics_url(url)
    invalid: list[InvalidAnswer] = []

    def read_time() -> engine_time.DecodeTime | None:
        return engine_time.decode_time(server_counters.metrics_text(url), where, model)

    def guarded(read: Callable[[], Any]) -> Any:
        try:
            return read()
        except InvalidAnswer as exc:
            invalid.append(exc)
            return None

    before = guarded(lambda: server_counters.read_counters(url, model))
    before_time = guarded(read_time)

    def one(row: dict) -> Completion:
        n = len(row["completion_ids"])
        params = sampling_params(sampling, row)
        return complete(
            url, row["prompt_ids"], n, vocab, model=model, timeout=timeout, params=params
        )

    done: list[Completion] = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="online") as pool:
        for c in pool.map(one, rows):
            done.append(c)
            if on_done:
                on_done(len(done), len(rows))
    seconds = time.perf_counter() - t0
    invalid += [c.invalid for c in done if c.invalid is not None]
    want = server_counters.expected([c.spec for c in done]) if not invalid else None
    got = None
    if before is not None:
        got = guarded(
            lambda: server_counters.settled(url, before, want, len(rows), model, settle_s)
        )
    spent = guarded(lambda: engine_time.settled(read_time, before_time, len(rows), where, settle_s))
    return {
        "samples": [_record(row, c) for row, c in zip(rows, done, strict=True)],
        "counters": None if got is None else got.to_json(),
        "counters_expected": None if want is None else want.to_json(),
        "counters_agree": None if want is None or got is None else got == want,
        "seconds": seconds,
        "tokens": sum(len(c.token_ids) for c in done),
        "decode": None
        if spent is None
        else {
            "seconds": spent.seconds,
            "requests": spent.requests,
            "source": engine_time.DECODE_TIME,
        },
        "invalid": _first_per_field(invalid),
    }


def _first_per_field(found: list[InvalidAnswer]) -> list[dict[str, str]]:
    """Each field's first impossible count, so a broken counter is said once."""
    seen: dict[str, dict[str, str]] = {}
    for exc in found:
        seen.setdefault(exc.field, exc.to_json())
    return list(seen.values())
