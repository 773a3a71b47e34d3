"""Ground truth for the offline walk: each prompt's GREEDY completion by the target, as ids.

Runs on the eval host, as a job's first phase, because the serving engine usually listens
on the host's own loopback. Sources (``spec["ground_truth"]["kind"]``):

- ``sglang``: SGLang's native ``POST /generate`` with ``input_ids`` and
  ``sampling_params {temperature: 0, max_new_tokens}``; the answer's ``output_ids``.
- ``openai``: an OpenAI-compatible ``POST /v1/completions`` whose ``prompt`` is the list of
  token ids and which returns ids when asked (``return_token_ids: true``, as vLLM >= 0.10.2
  and SGLang offer): ``choices[0].token_ids``.
- ``openai-text``: a text-only OpenAI-compatible server (``transformers serve``, ...). Text
  is not ids: decode-then-encode does not always round-trip. Accepted with a loud warning;
  the completion is retokenised with the target's tokenizer and every sample is checked
  (see `retokenisation_check`); the mismatch rate is recorded with the result.
- ``file``: a JSONL file already holding ``{"id", "prompt_ids", "completion_ids"}`` lines.
- ``local``: greedy generation on this host with the target itself (slow for big models),
  ``concurrency`` prompts per ``generate`` call (left-padded and masked, as a serving engine
  batches requests; 1: one prompt at a time).

Prompts are JSONL, z-lab's ``{"turns": [...]}`` (the first turn is the user message) or
``{"prompt": "..."}``; the target's chat template is applied (``thinking`` on or off).
``samples`` picks that many prompts with a seeded RNG, in file order.

Requests to a server go out concurrently, up to ``spec["ground_truth"]["concurrency"]``
(default 16) in flight at once, because serving engines batch concurrent requests; answers
are taken, checked and recorded in prompt order, so the result is the serial one.

The result is cached in ``<workdir>/groundtruth/<key>.jsonl`` where ``key`` hashes the
target's identity (its path, config and weight files' sizes), the exact prompt ids (so
the prompt file, the selection, the template and the thinking flag are all in it), the
sampling parameters, the kind of source and, for a server, its URL and the model it serves
as it reports it (SGLang ``GET /get_model_info`` -> ``model_path``; OpenAI-compatible
``GET /v1/models`` -> ``id`` and ``root``): the next checkpoint evaluated against the same
prompts and the same server reuses it, another server or model never does. Every
completion is validated (integer ids inside the target's vocabulary, non-empty, at most
``max_new_tokens``) BEFORE anything is cached, so a bad server's answer is refused in one
line and never reused; a cache entry that fails the same checks is ignored. The info
returned (and recorded in the result) says whether the ground truth came from the cache and
which source made it (``source``: kind, URL, model, time).

Only greedy decoding is accepted: a ground truth sampled at temperature > 0 is not what
speculative decoding with greedy verification reproduces. A server whose answer reports
non-greedy sampling parameters is refused the same way.

A server is its own trust domain. Every wait on it is bounded (`remote.protocol.GTLimits`):
``timeout`` seconds of silence on one read, ``deadline`` seconds per request however it
trickles, ``phase_deadline`` for the whole phase (local generation too); an answer is read
only up to what a valid one can take (`answer_bytes`) before it is parsed; a redirect is
refused, never followed. After the eval, `judge` weighs the target's agreement with the
ground truth: one it disagrees with wholesale is flagged and leaves the cache. ``fresh``
in the job's ``ground_truth`` remakes an entry on purpose.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic, write_json_atomic
from remote.errors import UserError
from remote.protocol import (
    SERVER_KINDS,
    EvalSpec,
    GTLimits,
    JobSpec,
    ResultError,
    SpecError,
    agreement_suspect,
    flag_suspect,
    is_int,
    non_greedy,
    sample_labels,
)

# Bumped when what a cache entry means changes, so older entries are never hit.
CACHE_VERSION = 2
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")

Emit = Callable[..., None]


# ---- prompts ----------------------------------------------------------------------------


def read_jsonl(path: str, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; one-line UserErrors otherwise."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError:
            raise UserError(f"{path}:{n}: not valid JSON") from None


def load_prompts(path: str, samples: int | None = None, seed: int = 0) -> list[dict]:
    """Prompt records ``{"id", "text"}`` from a JSONL file, optionally a seeded subset."""
    records = []
    stem = Path(path).stem
    for n, obj in read_jsonl(path, "prompts file"):
        if (
            isinstance(obj, dict)
            and isinstance(obj.get("turns"), list)
            and obj["turns"]
            and isinstance(obj["turns"][0], str)
        ):
            text = obj["turns"][0]
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            text = obj["prompt"]
        else:
            raise UserError(f'{path}:{n}: expected {{"turns": ["..."]}} or {{"prompt": "..."}}')
        try:
            labels = sample_labels(obj)
        except ResultError as exc:
            raise UserError(f"{path}:{n}: {exc}") from None
        records.append({"id": str(obj.get("id", f"{stem}-{len(records)}")), "text": text, **labels})
    if not records:
        raise UserError(f"prompts file {path} holds no prompts")
    return select(records, samples, seed)


def select(records: list, samples: int | None, seed: int) -> list:
    """`samples` records chosen with a fixed seed, kept in their original order. Records
    of several categories (``category``) are chosen per category (`stratified`), so a
    small N still covers each; otherwise `samples` of them at random."""
    if samples is None or samples >= len(records):
        return list(records)
    if samples < 1:
        raise UserError(f"--samples must be at least 1, got {samples}")
    rng = random.Random(seed)
    groups: dict = {}
    for i, r in enumerate(records):
        groups.setdefault(r.get("category"), []).append(i)
    if len(groups) == 1:
        keep = rng.sample(range(len(records)), samples)
    else:
        keep = stratified(list(groups.values()), samples, rng)
    return [records[i] for i in sorted(keep)]


def stratified(groups: list[list[int]], samples: int, rng: random.Random) -> list[int]:
    """`samples` indices drawn from `groups` (each a category's indices): one from each
    group first (from `samples` groups drawn at random when there are fewer samples than
    groups), the rest shared in proportion to the groups' sizes (largest remainders, ties
    in the seeded order), each group's own drawn at random."""
    if samples < len(groups):
        return [rng.choice(groups[g]) for g in rng.sample(range(len(groups)), samples)]
    rest, spare = samples - len(groups), sum(len(g) - 1 for g in groups)
    quotas = [rest * (len(g) - 1) / spare if spare else 0.0 for g in groups]
    take = [1 + int(q) for q in quotas]
    order = sorted(range(len(groups)), key=lambda g: (int(quotas[g]) - quotas[g], rng.random()))
    for g in order[: samples - sum(take)]:
        take[g] += 1
    return [i for g, n in zip(groups, take, strict=True) for i in rng.sample(g, n)]


def load_tokenizer(target: str):
    from transformers import AutoTokenizer

    from remote.model.files import no_tokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except Exception as exc:
        raise UserError(
            f"cannot load the target's tokenizer from {target}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if len(tokenizer) <= 1:  # transformers 5 builds an empty one from config.json alone
        raise UserError(no_tokenizer(target))
    return tokenizer


def render_prompt(tokenizer, text: str, thinking: bool) -> tuple[str, list[int]]:
    """(prompt text, prompt ids) with the chat template applied, generation prompt added."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=thinking,
        )
    else:
        rendered = text
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return rendered, list(ids)


def chat_template_sha256(tokenizer) -> str | None:
    """sha256 of the chat template `render_prompt` applies (None: there is none, the text
    goes as it is), recorded with the ground truth so runs under another template are
    told apart."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# ---- identity and cache -----------------------------------------------------------------


def target_identity(target: str) -> dict:
    """What identifies a target without reading its weights: path, config hash, files."""
    root = Path(target)
    config = root / "config.json"
    try:
        config_hash = hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError:
        raise UserError(f"no config.json in target folder {target}") from None
    files = sorted(
        (p.name, p.stat().st_size) for p in root.iterdir() if p.suffix in WEIGHT_SUFFIXES
    )
    return {"path": str(root.resolve()), "config_sha256": config_hash, "weights": files}


def cache_key(
    identity: dict,
    prompt_ids: list[list[int]],
    sampling: dict,
    kind: str,
    source: dict | None = None,
    labels: list[dict] | None = None,
) -> str:
    """The cache entry's name: a hash of the target's identity, the sampling parameters, the
    kind of source, the source's own identity (URL and served model, `served_model`),
    every prompt's exact ids and, when any prompt has one, the prompts' labels."""
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "v": CACHE_VERSION,
                "target": identity,
                "sampling": sampling,
                "kind": kind,
                "source": source or {},
            },
            sort_keys=True,
        ).encode()
    )
    for ids in prompt_ids:
        h.update(json.dumps(ids).encode() + b"\n")
    if labels and any(labels):  # unlabelled sets keep the names they always had
        h.update(json.dumps(labels, sort_keys=True).encode())
    return h.hexdigest()[:24]


def target_vocab_size(target: str, tokenizer) -> int:
    """How many token ids the target has: its (text) config's ``vocab_size`` (the rows of
    its embedding), else the tokenizer's length."""
    from remote.model.files import build_config

    try:
        vocab = build_config(Path(target)).get_text_config().vocab_size
    except (UserError, AttributeError):
        vocab = None
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else len(tokenizer)


def check_completion(
    ids: Any, *, vocab: int, max_new: int | None, prompt_id: str, source: str, target: str
) -> list[int]:
    """`ids` if they can be the target's greedy completion: a non-empty list of integer
    ids, each inside the vocabulary, at most `max_new` of them (None: any number, for
    retokenised text). Otherwise one UserError naming the source (a server URL, or the
    local generation) and the bad value."""
    if not _int_list(ids):
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} is not a list of "
            "integer token ids; nothing was cached"
        )
    if not ids:
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} is empty (the "
            "target stopped at once); drop that prompt or check the server"
        )
    if max_new is not None and len(ids) > max_new:
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} has {len(ids)} "
            f"token ids, more than max_new_tokens {max_new}; nothing was cached"
        )
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise UserError(
            f"ground truth from {source} for prompt {prompt_id} holds token id "
            f"{bad}, outside the target's vocabulary (0..{vocab - 1}): it serves "
            f"another model or tokenizer than {target}; nothing was cached"
        )
    return ids


# ---- HTTP -------------------------------------------------------------------------------


def endpoint(url: str, kind: str) -> str:
    """The request URL for a base server URL (a full endpoint URL is used as given)."""
    url = url.rstrip("/")
    if kind == "sglang":
        return url if url.endswith("/generate") else url + "/generate"
    if url.endswith("/v1/completions"):
        return url
    return url + "/completions" if url.endswith("/v1") else url + "/v1/completions"


# What a valid answer can take: per token (prompt ids an OpenAI server echoes, completion
# ids, and in ``text`` the token's piece, which real vocabularies keep under ~256 bytes,
# JSON-escaped up to 6x) and a fixed part (meta_info, usage, ids of the request). An answer
# past its bound is refused before it is parsed: unbounded, 16 hostile answers of 286 MiB
# in flight took 13 GiB here (benchmarks/groundtruth_memory.py).
ANSWER_BASE_BYTES = 1 << 20
ANSWER_BYTES_PER_TOKEN = 2048
INFO_ANSWER_BYTES = 1 << 20  # GET /get_model_info, /v1/models
ERROR_DETAIL_BYTES = 300  # of an error answer's body, shown in its line


def answer_bytes(prompt_tokens: int, max_new: int) -> int:
    """The most bytes a valid answer to a request of `prompt_tokens` ids for at most
    `max_new` new ones can take (see ANSWER_BASE_BYTES)."""
    return ANSWER_BASE_BYTES + ANSWER_BYTES_PER_TOKEN * (prompt_tokens + max_new)


class Redirected(UserError):
    """A server answered a redirect (refused, never followed: see `http_json`)."""


@dataclass(frozen=True)
class Deadline:
    """When (``time.monotonic()``) a request must have ended, and the words for that bound
    in the line that says it passed (which setting to raise)."""

    at: float
    words: str


class Waits:
    """The bounds on one ground-truth phase's waits (`remote.protocol.GTLimits`): each
    request ends at its own deadline or the phase's, whichever comes first; `abort` ends
    every request still in flight (the phase failed: nothing waits for them)."""

    def __init__(self, limits: GTLimits, started: float | None = None):
        self.limits = limits
        self.phase_end = (time.monotonic() if started is None else started) + limits.phase_deadline
        self._live: set[_Watchdog] = set()
        self._lock = threading.Lock()
        self._aborted = False

    def phase_words(self) -> str:
        return (
            f"the ground-truth phase's deadline of {self.limits.phase_deadline:g}s; raise it "
            "with --gt-phase-deadline (inventory: ground_truth_phase_deadline)"
        )

    def request(self) -> Deadline:
        """The deadline of a request that starts now."""
        own = time.monotonic() + self.limits.deadline
        if own < self.phase_end:
            return Deadline(
                own,
                f"its deadline of {self.limits.deadline:g}s per request; raise it with "
                "--gt-deadline (inventory: ground_truth_deadline) if the server is only slow",
            )
        return Deadline(self.phase_end, self.phase_words())

    def watch(self, deadline: Deadline) -> _Watchdog:
        dog = _Watchdog(deadline.at)
        with self._lock:
            if self._aborted:
                dog.expire()
            self._live.add(dog)
        return dog

    def release(self, dog: _Watchdog) -> None:
        with self._lock:
            self._live.discard(dog)
        dog.close()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            live = list(self._live)
        for dog in live:
            dog.expire()


class _Watchdog:
    """Shuts one connection down at its deadline, however the server trickles: a timer
    thread shuts the socket (a duplicate of its descriptor, so it works under TLS too), and
    the blocked read returns at once. `expired` tells the reader why its read ended."""

    def __init__(self, at: float):
        self.at = at
        self.expired = False
        self._sock: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock.dup()
            if self.expired:
                self._shut()
                return
        self._timer = threading.Timer(max(0.0, self.at - time.monotonic()), self.expire)
        self._timer.daemon = True
        self._timer.start()

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _printable(text: str, limit: int = 200) -> str:
    """A server's words (a Location, an error body) fit for one line: control characters
    and lone surrogates escaped, cut at `limit` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def http_json(
    url: str,
    payload: dict | None,
    timeout: float,
    *,
    deadline: Deadline | None = None,
    waits: Waits | None = None,
    max_bytes: int = INFO_ANSWER_BYTES,
) -> Any:
    """POST (or GET when `payload` is None) JSON and parse the answer; every failure is one
    clear UserError naming `url`. `timeout`: seconds of silence on one read; `deadline`:
    when the whole exchange must have ended (connect to the answer's last byte; default:
    `timeout` from now), watched through `waits` when given (`Waits.abort` ends it too).
    `max_bytes`: the answer's bound, checked against its Content-Length and as it is read,
    before it is parsed. A redirect is refused, never followed: the ground truth is what
    THIS server answers, the cache is keyed by its URL, and following one would let any
    server make this host send requests elsewhere."""
    deadline = deadline or Deadline(time.monotonic() + timeout, f"its timeout of {timeout:g}s")
    dog = waits.watch(deadline) if waits else _Watchdog(deadline.at)
    try:
        status, reason, location, body = _exchange(url, payload, timeout, deadline, dog, max_bytes)
    except UserError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if dog.expired or time.monotonic() >= deadline.at:
            raise UserError(
                f"ground truth server {url} had not finished answering at {deadline.words}"
            ) from None
        raise UserError(_connection_problem(url, exc, timeout)) from None
    finally:
        if waits:
            waits.release(dog)
        else:
            dog.close()
    if dog.expired:  # a body cut short by the shutdown can still look whole
        raise UserError(f"ground truth server {url} had not finished answering at {deadline.words}")
    if 300 <= status < 400:
        raise Redirected(
            f"ground truth server {url} redirected (HTTP {status} {reason}) to "
            f"{_printable(location or '(no Location)')}; redirects are not followed: point "
            "the ground truth at the server that answers"
        )
    if status >= 400:
        detail = _printable(body.decode(errors="replace").strip(), ERROR_DETAIL_BYTES)
        raise UserError(
            f"ground truth server {url} answered HTTP {status} {reason}"
            f"{': ' + detail if detail else ''}"
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        snippet = body[:80].decode(errors="replace").replace("\n", " ")
        raise UserError(f"ground truth server {url} returned malformed JSON: {snippet!r}") from None


def _exchange(
    url: str,
    payload: dict | None,
    timeout: float,
    deadline: Deadline,
    dog: _Watchdog,
    max_bytes: int,
) -> tuple[int, str, str | None, bytes]:
    """(status, reason, Location, body) of one request over its own connection (plain
    http.client: no redirect is followed, no proxy from the environment is used), the
    socket watched by `dog` from the moment it connects."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"ground truth URL {url!r} is not an http(s) URL")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    left = deadline.at - time.monotonic()
    if left <= 0:
        dog.expire()
        raise TimeoutError
    sock = socket.create_connection((parts.hostname, port), min(timeout, left))
    try:
        sock.settimeout(timeout)  # per read; the deadline is the watchdog's
        dog.arm(sock)
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
    except BaseException:
        sock.close()
        raise
    conn_class = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = conn_class(parts.hostname, port, timeout=timeout)
    conn.sock = sock
    try:
        data = None if payload is None else json.dumps(payload).encode()
        conn.request(
            "GET" if data is None else "POST",
            (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            body=data,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        resp = conn.getresponse()
        location = resp.getheader("Location")
        if 300 <= resp.status < 400:
            return resp.status, resp.reason, location, b""
        if resp.status >= 400:
            return resp.status, resp.reason, location, resp.read(ERROR_DETAIL_BYTES)
        declared = resp.getheader("Content-Length")
        if declared and declared.strip().isdigit() and int(declared) > max_bytes:
            raise UserError(_too_big(url, f"announces {int(declared)} bytes", max_bytes))
        body = resp.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise UserError(_too_big(url, f"sent more than {max_bytes} bytes", max_bytes))
        return resp.status, resp.reason, location, body
    finally:
        conn.close()


def _too_big(url: str, what: str, max_bytes: int) -> str:
    return (
        f"ground truth server {url} {what}, larger than any answer to this request can be "
        f"({max_bytes} bytes for its prompt and max_new_tokens); refused before it was "
        "parsed, nothing was cached"
    )


def _connection_problem(url: str, exc: BaseException, timeout: float) -> str:
    """The line for a request that failed on the way (no deadline passed)."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"ground truth server {url} did not answer within {timeout:g}s (timed out)"
    if isinstance(exc, ConnectionRefusedError):
        return (
            f"ground truth server {url} refused the connection; is it running and "
            "listening there (from the eval host's view)?"
        )
    if isinstance(exc, socket.gaierror):
        return f"ground truth server {url} is unreachable: {exc.strerror or exc}"
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError):
        return f"ground truth server {url} sent a broken HTTP answer: {_printable(repr(exc))}"
    return f"ground truth server {url} dropped the connection: {exc}"


def reachable(url: str, timeout: float = 5.0) -> str | None:
    """None when something accepts TCP connections at the URL's host and port, else why."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"ground truth URL {url!r} is not an http(s) URL"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return f"ground truth server {url} refused the connection from this host; is it running?"
    except TimeoutError:
        return f"ground truth server {url} did not accept a connection within {timeout:g}s"
    except OSError as exc:
        return f"ground truth server {url} is unreachable from this host: {exc.strerror or exc}"


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(v) for v in value)


def reported_sampling(answer: Any) -> dict:
    """The sampling parameters a server's answer says it used, where it says any: keys
    ``temperature``, ``top_p``, ``top_k``, ``do_sample`` at the top, in SGLang's
    ``meta_info``, in an OpenAI ``choices[0]``, or in a ``sampling_params`` object of any of
    those. Empty when the answer reports nothing (most servers)."""
    found: dict = {}
    places = [answer] if isinstance(answer, dict) else []
    if places:
        places.append(answer.get("meta_info"))
        choices = answer.get("choices")
        if isinstance(choices, list) and choices:
            places.append(choices[0])
    for place in list(places):
        if isinstance(place, dict):
            places.append(place.get("sampling_params"))
    for place in places:
        if isinstance(place, dict):
            for key in ("temperature", "top_p", "top_k", "do_sample"):
                if key in place and key not in found:
                    found[key] = place[key]
    return found


def check_answer_greedy(answer: Any, url: str) -> None:
    """Refuse an answer whose server reports it sampled instead of decoding greedily."""
    problem = non_greedy(reported_sampling(answer))
    if problem:
        shown = ", ".join(f"{k}={v}" for k, v in problem.items())
        raise UserError(
            f"ground truth server {url} reports non-greedy sampling ({shown}) "
            "although temperature 0 was asked; tau must be measured against "
            "greedy completions, so its answer is refused: serve the target "
            "without sampling overrides"
        )


def _ask(url: str, payload: dict, prompt_tokens: int, sampling: dict, waits: Waits) -> Any:
    """One completion request within `waits`' bounds, its answer bounded in size."""
    return http_json(
        url,
        payload,
        waits.limits.timeout,
        deadline=waits.request(),
        waits=waits,
        max_bytes=answer_bytes(prompt_tokens, sampling["max_new_tokens"]),
    )


def sglang_generate(url: str, prompt_ids: list[int], sampling: dict, waits: Waits) -> Any:
    """SGLang's ``output_ids`` for one prompt, unchecked (see `check_completion`)."""
    ep = endpoint(url, "sglang")
    answer = _ask(
        ep,
        {
            "input_ids": prompt_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": sampling["max_new_tokens"]},
        },
        len(prompt_ids),
        sampling,
        waits,
    )
    if isinstance(answer, list) and len(answer) == 1:  # a batch of one
        answer = answer[0]
    ids = answer.get("output_ids") if isinstance(answer, dict) else None
    if not isinstance(ids, list):
        raise UserError(
            f"ground truth server {ep} answered without an 'output_ids' list of "
            "token ids; is it SGLang's native server?"
        )
    check_answer_greedy(answer, ep)
    return ids


def served_model(kind: str, url: str, model: str | None, waits: Waits) -> dict:
    """The model a server says it serves, for the cache key and the result's provenance:
    SGLang's ``GET /get_model_info`` ``model_path``; for OpenAI-compatible servers the name
    used (given, else the first ``GET /v1/models`` lists) and that entry's ``root`` (the
    weights' path, as vLLM and SGLang report it). A value the server does not report is
    None (the request then names no model and a single-model server uses its own). A
    redirect is refused here too (`Redirected`); any other failure counts as no answer."""

    def ask(path: str) -> Any:
        try:
            return http_json(
                path, None, min(waits.limits.timeout, 30.0), deadline=waits.request(), waits=waits
            )
        except Redirected:
            raise
        except UserError:
            return None

    if kind == "sglang":
        info = ask(endpoint(url, "sglang")[: -len("/generate")] + "/get_model_info")
        path = info.get("model_path") if isinstance(info, dict) else None
        return {"model": path if isinstance(path, str) and path else None}
    listing = ask(endpoint(url, "openai").rsplit("/completions", 1)[0] + "/models")
    entries = listing.get("data") if isinstance(listing, dict) else None
    entries = (
        [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
        if isinstance(entries, list)
        else []
    )
    name = model or (entries[0]["id"] if entries else None)
    entry = next((e for e in entries if e["id"] == name), {})
    root = entry.get("root")
    return {"model": name, "model_root": root if isinstance(root, str) and root else None}


def _with_model(payload: dict, model: str | None) -> dict:
    return {"model": model, **payload} if model else payload


def openai_completion_ids(
    url: str, model: str | None, prompt_ids: list[int], sampling: dict, waits: Waits
) -> Any:
    """``choices[0].token_ids`` for one prompt, unchecked (see `check_completion`)."""
    ep = endpoint(url, "openai")
    answer = _ask(
        ep,
        _with_model(
            {
                "prompt": prompt_ids,
                "max_tokens": sampling["max_new_tokens"],
                "temperature": 0.0,
                "return_token_ids": True,
            },
            model,
        ),
        len(prompt_ids),
        sampling,
        waits,
    )
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise UserError(
            f"ground truth server {ep} answered without 'choices'; is it an "
            "OpenAI-compatible completions endpoint?"
        ) from None
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not isinstance(ids, list):
        raise UserError(
            f"ground truth server {ep} returned no token ids (choices[0].token_ids);"
            " it needs return_token_ids support (vLLM >= 0.10.2, recent SGLang), "
            "or use ground_truth_kind openai-text (text only, retokenised)"
        )
    check_answer_greedy(answer, ep)
    echoed = choice.get("prompt_token_ids", answer.get("prompt_token_ids"))
    if _int_list(echoed) and echoed and echoed != prompt_ids:
        raise UserError(
            f"ground truth server {ep} tokenised the prompt differently "
            f"({len(echoed)} ids back for {len(prompt_ids)} sent); it does not "
            "take token-id prompts as given"
        )
    return ids


def openai_completion_text(
    url: str, model: str | None, prompt_text: str, sampling: dict, waits: Waits, prompt_tokens: int
) -> tuple[str, int | None]:
    """(completion text, the server's own count of completion tokens if it reports one);
    `prompt_tokens`: the prompt's length in the target's ids (for the answer's bound)."""
    ep = endpoint(url, "openai")
    answer = _ask(
        ep,
        _with_model(
            {"prompt": prompt_text, "max_tokens": sampling["max_new_tokens"], "temperature": 0.0},
            model,
        ),
        prompt_tokens,
        sampling,
        waits,
    )
    try:
        text = answer["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        text = None
    if not isinstance(text, str):
        raise UserError(
            f"ground truth server {ep} answered without choices[0].text; is it "
            "an OpenAI-compatible completions endpoint?"
        )
    check_answer_greedy(answer, ep)
    count = (answer.get("usage") or {}).get("completion_tokens")
    return text, count if isinstance(count, int) else None


def retokenisation_check(
    tokenizer,
    prompt_text: str,
    prompt_ids: list[int],
    completion_text: str,
    completion_ids: list[int],
    server_count: int | None = None,
) -> bool:
    """False when the retokenised ids cannot be what the server generated: the text holds
    U+FFFD (the server decoded a partial UTF-8 sequence: bytes were lost), the server
    counted another number of completion tokens, the ids do not decode back to the text,
    or encoding prompt and completion TOGETHER does not give the prompt's ids followed by
    the completion's (a merge across the boundary). Passing is necessary, not sufficient:
    a model may emit a non-canonical split of the same text, which only the eval's target
    agreement rate reveals."""
    if "\ufffd" in completion_text:
        return False
    if server_count is not None and server_count != len(completion_ids):
        return False
    if tokenizer.decode(completion_ids) != completion_text:
        return False
    joint = tokenizer(prompt_text + completion_text, add_special_tokens=False)["input_ids"]
    return list(joint) == list(prompt_ids) + list(completion_ids)


# ---- local greedy -----------------------------------------------------------------------


class LocalGenerator:
    """Greedy generation with the target on this host (transformers ``generate``, KV cache).

    `model`: the target already loaded (a job loads it once, `remote.eval.target`, and its
    engine then evaluates with that very model); its generation settings are read from the
    checkpoint as ``from_pretrained`` would. Without it the target is loaded here."""

    def __init__(self, target: str, dtype: str, threads: int | None, model=None):
        import torch

        self.target = target
        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        if model is not None:
            self.model = model
            self._generation_config(target)
            return
        from transformers import AutoModelForCausalLM

        try:
            self.model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype))
        except Exception as exc:
            raise UserError(
                f"cannot load the target {target} for local generation: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from None
        self.model.eval()

    def _generation_config(self, target: str) -> None:
        """The checkpoint's ``generation_config.json`` (its end-of-text ids, for one), as
        ``from_pretrained`` sets it; a model built from its config lacks it."""
        from transformers import GenerationConfig

        if Path(target, "generation_config.json").is_file():
            try:
                self.model.generation_config = GenerationConfig.from_pretrained(target)
            except Exception as exc:
                raise UserError(
                    f"cannot read {target}/generation_config.json: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                ) from None

    def generate_batch(
        self, prompts: list[list[int]], sampling: dict, max_time: float | None = None
    ) -> list[list[int]]:
        """Greedy completions of several prompts in ONE ``generate`` call, as a serving
        engine batches concurrent requests: left-padded, the padding masked out. Each
        completion ends at its first end-of-text id, as alone it would. `max_time`:
        seconds after which ``generate`` stops early (its completions then cut short)."""
        torch = self.torch
        width = max(len(ids) for ids in prompts)
        config = self.model.generation_config
        eos = config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = config.pad_token_id if config.pad_token_id is not None else min(eos, default=0)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=sampling["max_new_tokens"],
                pad_token_id=pad,
                max_time=max_time,
            )
        completions = []
        for row in out[:, width:].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            completions.append(row[:end])  # what follows a finished row is padding
        return completions

    def in_order(
        self, prompts: list[list[int]], sampling: dict, batch: int, waits: Waits | None = None
    ) -> Iterator[list[int]]:
        """Completions of `prompts`, yielded in order, generated `batch` prompts at a time;
        within the phase's deadline (`waits`), which ends a ``generate`` early and then
        the phase, in one line."""
        step = max(1, batch)
        for start in range(0, len(prompts), step):
            left = None if waits is None else waits.phase_end - time.monotonic()
            if left is not None and left <= 0:
                raise self._late(waits)
            out = self.generate_batch(prompts[start : start + step], sampling, left)
            if waits is not None and time.monotonic() >= waits.phase_end:
                raise self._late(waits)  # max_time may have cut it short
            yield from out

    def _late(self, waits: Waits) -> UserError:
        return UserError(
            f"local generation with {self.target} had not finished at {waits.phase_words()}"
        )


# ---- requests in flight together ----------------------------------------------------


def in_order(
    ask: Callable[[str, list[int]], Any], rendered: list[tuple[str, list[int]]], concurrency: int
) -> Iterator[Any]:
    """`ask(text, ids)` for every rendered prompt, yielded in prompt order. With
    `concurrency` > 1 up to that many requests are in flight at once (a serving engine
    batches them); the first failure in prompt order is raised, and requests not yet sent
    are dropped."""
    if concurrency <= 1 or len(rendered) <= 1:
        for text, ids in rendered:
            yield ask(text, ids)
        return
    pool = ThreadPoolExecutor(
        max_workers=min(concurrency, len(rendered)), thread_name_prefix="ground-truth"
    )
    try:
        futures = [pool.submit(ask, text, ids) for text, ids in rendered]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# ---- the phase --------------------------------------------------------------------------


def read_ground_truth_file(path: str) -> list[dict]:
    """Validated ``{"id", "prompt_ids", "completion_ids"}`` records from a JSONL file."""
    out = []
    for n, obj in read_jsonl(path, "ground truth file"):
        if not (
            isinstance(obj, dict)
            and _int_list(obj.get("prompt_ids"))
            and _int_list(obj.get("completion_ids"))
            and obj["prompt_ids"]
        ):
            raise UserError(
                f'{path}:{n}: expected {{"id", "prompt_ids": [...], '
                '"completion_ids": [...]}} with token ids'
            )
        try:
            labels = sample_labels(obj)
        except ResultError as exc:
            raise UserError(f"{path}:{n}: {exc}") from None
        out.append(
            {
                "id": str(obj.get("id", n)),
                **labels,
                "prompt_ids": obj["prompt_ids"],
                "completion_ids": obj["completion_ids"],
            }
        )
    if not out:
        raise UserError(f"ground truth file {path} holds no records")
    return out


def labelled(prompt: dict) -> dict:
    """A prompt's id and labels (category, sub-category: `remote.protocol.sample_labels`),
    as its ground-truth line and then its sample record carry them."""
    return {"id": prompt["id"], **sample_labels(prompt)}


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@contextmanager
def _aborting(waits: Waits) -> Iterator[None]:
    """Inside, a failure ends every request still in flight before it is raised."""
    try:
        yield
    except BaseException:
        waits.abort()
        raise


def _evict(path: Path, keep: Path | None = None) -> None:
    """Drop the cache entry whose data file is `path` (and its ``.json`` meta); with
    `keep`, its data is moved there instead of deleted (same filesystem: the workdir)."""
    meta = path.with_suffix(".json")
    for file, to in ((meta, None), (path, keep)):
        try:
            if to is not None:
                os.replace(file, to)
            else:
                file.unlink()
        except FileNotFoundError:
            pass


def _read_cache(
    path: Path, meta_path: Path, prompt_ids: list[list[int]], check: Callable[[Any, str], list[int]]
) -> tuple[list[dict], dict] | None:
    """(records, meta) of a cache entry that passes every check, else None (missing,
    unreadable, another prompt list, or ids that `check` refuses)."""
    try:
        meta = json.loads(meta_path.read_text())
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or len(records) != len(prompt_ids):
        return None
    try:
        for r, ids in zip(records, prompt_ids, strict=False):
            if not isinstance(r, dict) or r.get("prompt_ids") != ids:
                return None
            check(r.get("completion_ids"), str(r.get("id")))
    except UserError:
        return None
    return records, meta


def read_job(spec: dict | JobSpec) -> JobSpec:
    """The job `spec` typed (`remote.protocol.JobSpec`), each value checked; a bad one is
    one line (``job spec: ...``)."""
    if isinstance(spec, JobSpec):
        return spec
    try:
        return JobSpec.from_json(spec)
    except SpecError as exc:
        raise UserError(f"job spec: {exc}") from None


def prepare(
    spec: dict | JobSpec,
    emit: Emit = lambda *a, **k: None,
    engine: EvalSpec | None = None,
    load_model: Callable[[], Any] | None = None,
) -> tuple[str, dict]:
    """Make (or reuse) the ground truth the job asks for. The target (its tokenizer, and for
    kind ``local`` its dtype and threads) is the job's EvalSpec's (``eval``); `spec`: the
    job document, or the `JobSpec` the caller read from it; `engine`: the job's EvalSpec
    when the caller has read it already. `load_model`: gives the target's loaded model
    for local generation (called only when generation is needed), so a job that evaluates
    next loads it once; without it local generation loads its own.

    Returns (path of a JSONL file of ``{"id", "prompt_ids", "completion_ids"}``, info for
    the result: kind, url, model, cache key, ``cached`` (whether it came from the cache),
    ``source`` (kind, url, model, model_root, ``made``: when it was generated), warnings,
    retokenisation). A server is asked which model it serves before the cache is looked
    at; every completion is checked before anything is written. ``ground_truth.fresh``:
    the cache entry is dropped and made again. Every wait is bounded
    (`remote.protocol.GTLimits`: ``timeout``, ``deadline``, ``phase_deadline``, from
    this call on).
    """
    began = time.monotonic()
    job = read_job(spec)
    gt = job.ground_truth
    kind = gt.kind
    problem = gt.missing_source()
    if problem:
        raise UserError(problem)
    sampling = job.sampling.to_json()
    waits = Waits(gt.limits, started=began)
    concurrency = gt.concurrency
    workdir = Path(os.path.expanduser(job.workdir))
    info: dict[str, Any] = {
        "kind": kind,
        "url": gt.url,
        "path": gt.path,
        "sampling": sampling,
        "warnings": [],
    }

    if kind == "file":
        records = select(read_ground_truth_file(gt.path), job.samples, job.seed)
        # The selection belongs to this job: keep it in the job's folder.
        out = workdir / "jobs" / (job.job_id or "adhoc") / "ground_truth.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, _jsonl(records))
        info.update(
            cached=False,
            samples=len(records),
            file=str(out),
            source={"kind": "file", "path": gt.path, "made": time.time()},
        )
        emit("ground_truth", done=len(records), total=len(records), cached=False)
        return str(out), info

    engine = engine or job.engine
    target = engine.target
    if not job.prompts:
        raise UserError("the job names no prompts file (its prompts.path)")
    tokenizer = load_tokenizer(target)
    thinking = job.thinking
    prompts = load_prompts(job.prompts, job.samples, job.seed)
    rendered = [render_prompt(tokenizer, p["text"], thinking) for p in prompts]
    prompt_ids = [ids for _, ids in rendered]
    identity = target_identity(target)
    url = gt.url
    if kind in SERVER_KINDS:
        problem = reachable(url, min(waits.limits.timeout, 10.0))
        if problem:
            raise UserError(problem)
        # Who answers is part of what the ground truth is: another URL or another served
        # model is another cache entry.
        source = {
            "kind": kind,
            "url": endpoint(url, kind),
            **served_model(kind, url, gt.model, waits),
        }
        where = f"server {source['url']}" + (f" ({source['model']})" if source["model"] else "")
    else:  # local: the target itself, on this host
        source = {"kind": kind, "url": None, "model": identity["path"]}
        where = f"local generation with {target}"
    info["model"] = source.get("model")
    vocab = target_vocab_size(target, tokenizer)

    def check(ids: Any, prompt_id: str) -> list[int]:
        # Retokenised text may take more ids than the server generated: no length bound.
        limit = None if kind == "openai-text" else sampling["max_new_tokens"]
        return check_completion(
            ids, vocab=vocab, max_new=limit, prompt_id=prompt_id, source=where, target=target
        )

    # The labels are in the entry (its lines carry them): another labelling, another entry.
    labels = [sample_labels(p) for p in prompts]
    key = cache_key(identity, prompt_ids, sampling, kind, source, labels)
    cache_dir = workdir / "groundtruth"
    cache_dir.mkdir(parents=True, exist_ok=True)
    path, meta_path = cache_dir / f"{key}.jsonl", cache_dir / f"{key}.json"
    info.update(
        cache_key=key,
        file=str(path),
        thinking=thinking,
        chat_template_sha256=chat_template_sha256(tokenizer),
        samples=len(prompts),
    )
    if gt.fresh:  # asked for: whatever the entry holds, it is made again
        _evict(path)
        info["fresh"] = True
    hit = (
        _read_cache(path, meta_path, prompt_ids, check)
        if path.is_file() and meta_path.is_file()
        else None
    )
    if hit is not None:
        meta = hit[1]
        info.update(
            cached=True,
            warnings=meta.get("warnings", []),
            retokenisation=meta.get("retokenisation"),
            generated=meta.get("generated"),
            source=meta.get("source") or {**source, "made": meta.get("generated")},
        )
        for w in info["warnings"]:
            emit("warning", message=w)
        emit("ground_truth", done=len(prompts), total=len(prompts), cached=True)
        return str(path), info

    if kind == "openai-text":
        warning = (
            f"ground truth from a TEXT-only server ({url}): completions are "
            "retokenised with the target's tokenizer, which does not always give the "
            "ids the server generated; see the retokenisation mismatch rate"
        )
        info["warnings"].append(warning)
        emit("warning", message=warning)

    generator = None
    model_name = source.get("model")
    if kind == "local":
        generator = LocalGenerator(
            target,
            engine.dtype,
            engine.threads,
            model=load_model() if load_model else None,
        )

    def ask(text: str, ids: list[int]) -> Any:
        # Only the request runs in the pool: tokenising, checking and emitting stay on this
        # thread, in prompt order.
        if kind == "sglang":
            return sglang_generate(url, ids, sampling, waits)
        if kind == "openai":
            return openai_completion_ids(url, model_name, ids, sampling, waits)
        return openai_completion_text(url, model_name, text, sampling, waits, len(ids))

    records = []
    mismatched = 0
    started = time.time()
    # Closed on the way out, also when a check refuses an answer: no more requests go out,
    # and those in flight are ended (`Waits.abort`). Local generation batches
    # `concurrency` prompts per `generate`, as a server would.
    answers_in_order = (
        generator.in_order(prompt_ids, sampling, concurrency, waits)
        if generator is not None
        else in_order(ask, rendered, concurrency)
    )
    with closing(answers_in_order) as answers, _aborting(waits):
        for i, (prompt, (text, ids), answer) in enumerate(
            zip(prompts, rendered, answers, strict=False)
        ):
            completion = answer
            if kind == "openai-text":
                ctext, count = answer
                completion = list(tokenizer(ctext, add_special_tokens=False)["input_ids"])
                if not retokenisation_check(tokenizer, text, ids, ctext, completion, count):
                    mismatched += 1
            # Checked as it arrives, and all before the cache is written: a bad answer is
            # refused here and never reused by a later run.
            check(completion, prompt["id"])
            records.append({**labelled(prompt), "prompt_ids": ids, "completion_ids": completion})
            emit(
                "ground_truth", done=i + 1, total=len(prompts), cached=False, tokens=len(completion)
            )
    if kind == "openai-text":
        info["retokenisation"] = {
            "samples": len(records),
            "mismatched": mismatched,
            "mismatch_rate": mismatched / len(records),
            "check": "no U+FFFD in the text, server's token count matches, ids decode to the "
            "text, prompt+completion encodes to prompt ids + completion ids; a lower "
            "bound: compare the target agreement rate",
        }
        if mismatched:
            warning = (
                f"retokenisation mismatch in {mismatched} of {len(records)} samples "
                f"({mismatched / len(records):.0%}): their ground-truth ids may differ "
                "from what the server generated"
            )
            info["warnings"].append(warning)
            emit("warning", message=warning)
    generated = time.time()
    info.update(
        cached=False,
        generated=generated,
        seconds=round(generated - started, 3),
        source={**source, "made": generated},
    )
    write_atomic(path, _jsonl(records))
    meta = {
        k: info[k]
        for k in (
            "kind",
            "url",
            "model",
            "sampling",
            "thinking",
            "samples",
            "warnings",
            "retokenisation",
            "generated",
            "source",
        )
        if k in info
    }
    meta["target"] = identity
    write_json_atomic(meta_path, meta)
    return str(path), info


# ---- after the eval: does the target agree with it? ------------------------------------

# Where a ground truth judged wrong wholesale goes: out of the cache, into its job's folder.
SUSPECT_FILE = "ground_truth.suspect.jsonl"


def judge(info: dict, agreement: Any, job_dir: Path, emit: Emit = lambda *a, **k: None) -> dict:
    """`info` (`prepare`'s) judged by the target's agreement with it (`agreement`: a result's
    ``metrics.target_agreement``). Below `remote.protocol.GT_SUSPECT_AGREEMENT` the ground
    truth is wrong wholesale, whatever its ids looked like: the info returned is flagged
    (``suspect``: agreement, threshold, evicted; a warning, also emitted) and its cache
    entry is taken out of the cache into `job_dir` (`SUSPECT_FILE`, which ``file`` then
    names), so no later eval reuses it and the answer stays there for a look. Otherwise
    `info` comes back as it was."""
    rate = agreement.get("rate") if isinstance(agreement, dict) else None
    if not agreement_suspect(rate):
        return info
    evicted = False
    if info.get("cache_key") and info.get("file"):
        kept = job_dir / SUSPECT_FILE
        _evict(Path(info["file"]), keep=kept)
        if kept.is_file():
            evicted, info = True, {**info, "file": str(kept)}
    flagged = flag_suspect(info, rate, evicted)
    emit("warning", message=flagged["warnings"][-1])
    return flagged


def judge_job(info: dict, job_dir: Path, emit: Emit = lambda *a, **k: None) -> dict:
    """`judge` with the agreement of the job's own ``result.json`` (none there: as it was)."""
    try:
        result = json.loads((job_dir / "result.json").read_text())
    except (OSError, ValueError):
        return info
    metrics = result.get("metrics") if isinstance(result, dict) else None
    agreement = metrics.get("target_agreement") if isinstance(metrics, dict) else None
    return judge(info, agreement, job_dir, emit)
