"""vLLM's speculative-decoding acceptance, read from its OpenAI-compatible server.

Two sources, both validated before use (one line naming the server and the field):

- Per request, ``POST /v1/completions`` with the prompt as token ids, greedy, ``ignore_eos``
  (so the output is exactly ``max_tokens`` long, like the ground truth it is compared with)
  and ``return_token_ids``; with the server started with
  ``--per-request-spec-decode-metrics detailed`` the answer's
  ``metrics.speculative_decoding`` holds ``acceptance_histogram`` (index ``j``: verify steps
  that accepted ``j`` draft tokens), ``num_spec_steps``, ``num_accepted_draft_tokens``,
  ``num_draft_tokens``, ``num_spec_tokens``, ``mean_acceptance_length`` (1 + accepted /
  steps) and the ordered ``per_step_accepted`` / ``per_step_drafted`` (``summary``: all but
  the per-step arrays). vLLM marks the field experimental; a shape this module does not
  know is refused, never guessed at.
- For the whole server, ``GET /metrics`` (Prometheus text): the counters
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position}``
  (0-based), read as differences around a run (`Counters.minus`); and the engine's own
  timing, the histogram ``vllm:request_decode_time_seconds`` (per finished request, its
  last token's time minus its first's: the decode steps after the prefill), whose
  ``_sum`` and ``_count`` give the decode seconds of the run's requests
  (`remote.online.engine_time`).

vLLM counts a verify step's accepted tokens even past ``max_tokens`` (they are dropped from
the output, not from the counts): `remote.online.verdict` cuts the steps the way the offline
walk cuts its rounds before comparing.

Stdlib only, through the host side's one HTTP client (`remote.httpclient`: answers bounded,
redirects refused): the server listens on a host's loopback, so this runs there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from remote.errors import UserError
from remote.httpclient import answer_bytes, http_body, http_json
from remote.online.prometheus import parse_prometheus
from remote.protocol import is_int

ROLE = "serving engine"  # as every error line names it
METRICS_BYTES = 16 << 20  # a /metrics page: vLLM's is tens of KiB, histograms included
METRIC = "vllm:spec_decode_"
COUNTER_NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POSITION = "num_accepted_tokens_per_pos"
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
    """One request's acceptance as the server reports it (validated by `spec_decoding`).
    ``accepted``/``drafted``: per verify step, in order (None at the ``summary`` level)."""

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
    """One greedy completion: its ids, and its acceptance when the server reports it."""

    token_ids: list[int]
    finish_reason: str | None
    spec: SpecDecoding | None


def spec_decoding(obj: Any, where: str) -> SpecDecoding:
    """Validate ``metrics.speculative_decoding``: types, ranges and the counts' own
    consistency (histogram length k+1, steps and accepted tokens equal to the histogram's,
    per-step arrays as long as the steps, each ``0 <= accepted <= drafted <= k``, their sums
    and histogram equal to the totals, the mean equal to 1 + accepted / steps)."""
    f = f"{where} metrics.speculative_decoding"
    if not isinstance(obj, dict):
        raise UserError(f"{f} is {type(obj).__name__}, not an object")
    missing = [k for k in SPEC_FIELDS if k not in obj]
    if missing:
        raise UserError(f"{f} lacks {', '.join(missing)}; is this vLLM 0.32 or later?")
    k, hist = obj["num_spec_tokens"], obj["acceptance_histogram"]
    if not is_int(k) or k < 1:
        raise UserError(f"{f}.num_spec_tokens is {k!r}, not a positive integer")
    if not _int_list(hist) or len(hist) != k + 1 or min(hist) < 0:
        raise UserError(
            f"{f}.acceptance_histogram is {hist!r}, not {k + 1} counts (0..{k} accepted)"
        )
    steps, accepted = sum(hist), sum(j * n for j, n in enumerate(hist))
    for name, want in (("num_spec_steps", steps), ("num_accepted_draft_tokens", accepted)):
        if obj[name] != want or not is_int(obj[name]):
            raise UserError(f"{f}.{name} is {obj[name]!r} but its histogram says {want}")
    drafts = obj["num_draft_tokens"]
    if not is_int(drafts) or not accepted <= drafts <= k * steps:
        raise UserError(
            f"{f}.num_draft_tokens is {drafts!r}, outside {accepted}..{k * steps} "
            "(accepted..k x steps)"
        )
    mean = obj["mean_acceptance_length"]
    want_mean = 1.0 + accepted / steps if steps else 1.0
    if not isinstance(mean, (int, float)) or not math.isclose(mean, want_mean, abs_tol=1e-6):
        raise UserError(f"{f}.mean_acceptance_length is {mean!r}, its histogram says {want_mean}")
    per_acc, per_drafted = obj.get("per_step_accepted"), obj.get("per_step_drafted")
    if (per_acc is None) != (per_drafted is None):
        raise UserError(f"{f} has one of per_step_accepted / per_step_drafted without the other")
    if per_acc is not None:
        for name, v in (("per_step_accepted", per_acc), ("per_step_drafted", per_drafted)):
            if not _int_list(v) or len(v) != steps:
                raise UserError(f"{f}.{name} is not {steps} integers (one per verify step)")
        steps_ok = (0 <= a <= d <= k for a, d in zip(per_acc, per_drafted, strict=True))
        bad = next((i for i, ok in enumerate(steps_ok) if not ok), None)
        if bad is not None:
            raise UserError(
                f"{f} step {bad} accepted {per_acc[bad]} of {per_drafted[bad]} drafted "
                f"tokens (k = {k})"
            )
        if sum(per_drafted) != drafts or [per_acc.count(j) for j in range(k + 1)] != hist:
            raise UserError(f"{f} per-step arrays disagree with its totals")
    return SpecDecoding(k, list(hist), drafts, float(mean), per_acc, per_drafted)


def parse_completion(
    answer: Any, where: str, prompt_ids: list[int], max_tokens: int, vocab: int
) -> Completion:
    """Validate a ``/v1/completions`` answer for one token-id prompt: one choice whose
    ``token_ids`` are exactly ``max_tokens`` ids inside ``0..vocab-1``, the echoed prompt
    (when echoed) equal to the one sent, and its speculative-decoding metrics (when given)."""
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
    spec = (metrics or {}).get("speculative_decoding")
    finish = choice.get("finish_reason")
    return Completion(
        list(ids),
        finish if isinstance(finish, str) else None,
        None if spec is None else spec_decoding(spec, where),
    )


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
) -> Completion:
    """One greedy completion of exactly ``max_tokens`` tokens (``ignore_eos``), validated
    (`parse_completion`)."""
    where = completions_url(url)
    payload = {
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "n": 1,
        "return_token_ids": True,
    }
    if model:
        payload["model"] = model
    bound = answer_bytes(len(prompt_ids), max_tokens)
    answer = http_json(where, payload, timeout, max_bytes=bound, role=ROLE)
    return parse_completion(answer, where, prompt_ids, max_tokens, vocab)


# ---- /metrics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """vLLM's spec-decode counters, summed over engines: drafts (verify steps), draft
    tokens, accepted tokens, and accepted tokens per draft position (0-based)."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def minus(self, before: Counters, where: str) -> Counters:
        """The counts made between `before` and this reading; a counter that went down
        means the server restarted in between (one error line)."""
        if len(before.per_position) not in (0, len(self.per_position)):
            raise UserError(f"{where} changed its number of draft positions during the run")
        base = before.per_position or (0,) * len(self.per_position)
        pairs = [
            (self.drafts, before.drafts),
            (self.draft_tokens, before.draft_tokens),
            (self.accepted, before.accepted),
            *zip(self.per_position, base, strict=True),
        ]
        if any(now < then for now, then in pairs):
            raise UserError(f"{where} spec-decode counters went down: did the server restart?")
        return Counters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(self.per_position, base, strict=True)),
        )


def spec_counters(text: str, where: str, model: str | None = None) -> Counters:
    """The spec-decode counters of a ``/metrics`` text (only samples whose ``model_name`` is
    `model`, when given), validated: whole non-negative numbers, positions 0..k-1 each
    once per engine, accepted <= draft tokens, per-position sums equal to the accepted
    total and non-increasing with the position. A server without speculative decoding has
    none of them: zeros and no positions."""
    totals = dict.fromkeys(COUNTER_NAMES, 0.0)
    per_pos: dict[tuple[str, int], float] = {}
    for name, labels, value in parse_prometheus(text, where):
        if not name.startswith(METRIC) or not name.endswith("_total"):
            continue
        if model is not None and labels.get("model_name", model) != model:
            continue
        short = name[len(METRIC) : -len("_total")]
        if not (value >= 0 and float(value).is_integer()):
            raise UserError(f"{where} {name} is {value!r}, not a whole count")
        if short in totals:
            totals[short] += value
        elif short == PER_POSITION:
            pos = labels.get("position", "")
            if not pos.isdigit():
                raise UserError(f"{where} {name} has position {pos!r}, not a number")
            key = (labels.get("engine", ""), int(pos))
            if key in per_pos:
                raise UserError(f"{where} {name} lists position {pos} twice")
            per_pos[key] = value
    k = 1 + max((p for _e, p in per_pos), default=-1)
    by_pos = [0] * k
    for (_engine, p), v in per_pos.items():
        by_pos[p] += int(v)
    engines = {e for e, _p in per_pos}
    if len(per_pos) != k * len(engines):
        raise UserError(f"{where} {METRIC}{PER_POSITION}_total lacks some positions 0..{k - 1}")
    c = Counters(*(int(totals[n]) for n in COUNTER_NAMES), tuple(by_pos))
    if c.accepted > c.draft_tokens or (k and c.draft_tokens > k * c.drafts):
        raise UserError(
            f"{where} counts {c.accepted} accepted of {c.draft_tokens} draft tokens in "
            f"{c.drafts} drafts of at most {k}: inconsistent"
        )
    grows = any(a < b for a, b in zip(by_pos, by_pos[1:], strict=False))
    if k and (sum(by_pos) != c.accepted or grows):
        raise UserError(
            f"{where} per-position accepted counts {by_pos} do not add up to {c.accepted} "
            "or grow with the position"
        )
    return c


def metrics_url(url: str) -> str:
    url = url.rstrip("/")
    for tail in ("/v1/completions", "/v1"):
        if url.endswith(tail):
            url = url[: -len(tail)]
    return url + "/metrics"


def read_counters(url: str, model: str | None = None, timeout: float = 30.0) -> Counters:
    where = metrics_url(url)
    text = http_body(where, None, timeout, max_bytes=METRICS_BYTES, role=ROLE)
    return spec_counters(text.decode(errors="replace"), where, model)


def expected_counters(completions: list[Completion]) -> Counters | None:
    """What the server's counters must have grown by for these completions, from their
    per-step arrays (None when some completion has none)."""
    specs = [c.spec for c in completions]
    if not specs or any(s is None or s.accepted is None for s in specs):
        return None
    k = max(s.num_spec_tokens for s in specs)
    per = [sum(sum(a > j for a in s.accepted) for s in specs) for j in range(k)]
    return Counters(
        sum(s.steps for s in specs),
        sum(s.num_draft_tokens for s in specs),
        sum(s.num_accepted for s in specs),
        tuple(per),
    )


def settled_counters(
    url: str,
    before: Counters,
    want: Counters | None,
    model: str | None = None,
    deadline_s: float = 10.0,
) -> Counters:
    """The counters' growth since `before`, read again until it equals `want` (vLLM updates
    /metrics from its engine's stats a moment after it answers) or `deadline_s` passed;
    then the last reading is returned as it is and the caller reports any difference."""
    end = time.monotonic() + deadline_s
    while True:
        delta = read_counters(url, model).minus(before, metrics_url(url))
        if want is None or delta == want or time.monotonic() >= end:
            return delta
        time.sleep(0.2)


# ---- a run --------------------------------------------------------------------------------


def measure(
    url: str,
    rows: list[dict],
    vocab: int,
    *,
    model: str | None = None,
    timeout: float = 300.0,
    on_done: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Send each ground-truth row's prompt (one request at a time, so the engine's batching
    never mixes samples), asking for exactly as many tokens as its completion; read the
    server's counters before and after. Returns ``samples`` (records for
    `remote.online.verdict.compare`), ``counters`` (their growth during the run),
    ``counters_expected`` (what the per-step arrays say it should be; None without them),
    ``counters_agree``, ``seconds`` and ``decode`` (the engine's own decode seconds of
    these requests, `DecodeTime`; None without its histogram). `on_done(done, total)`
    after each answer."""
    from remote.online import engine_time

    def read_time() -> engine_time.DecodeTime | None:
        where = metrics_url(url)
        text = http_body(where, None, 30.0, max_bytes=METRICS_BYTES, role=ROLE).decode(
            errors="replace"
        )
        return engine_time.decode_time(text, where, model)

    before = read_counters(url, model)
    before_time = read_time()
    t0 = time.perf_counter()
    done: list[Completion] = []
    samples = []
    for row in rows:
        c = complete(
            url, row["prompt_ids"], len(row["completion_ids"]), vocab, model=model, timeout=timeout
        )
        done.append(c)
        s = c.spec
        samples.append(
            {
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
        )
        if on_done:
            on_done(len(samples), len(rows))
    seconds = time.perf_counter() - t0
    want = expected_counters(done)
    got = settled_counters(url, before, want, model)
    spent = engine_time.settled(read_time, before_time, len(rows), metrics_url(url))
    return {
        "samples": samples,
        "counters": _counters_json(got),
        "counters_expected": None if want is None else _counters_json(want),
        "counters_agree": None if want is None else got == want,
        "seconds": seconds,
        "tokens": sum(len(c.token_ids) for c in done),
        "decode": None
        if spent is None
        else {
            "seconds": spent.seconds,
            "requests": spent.requests,
            "source": engine_time.DECODE_TIME,
        },
    }


def _counters_json(c: Counters) -> dict[str, Any]:
    return {
        "drafts": c.drafts,
        "draft_tokens": c.draft_tokens,
        "accepted": c.accepted,
        "accepted_per_position": list(c.per_position),
        "mean_acceptance_length": 1 + c.accepted / c.drafts if c.drafts else None,
    }
