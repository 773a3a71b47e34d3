"""The one HTTP client of the host side (the ground-truth phase, the online job's serving
engine): JSON over a connection of its own, every wait bounded (`Waits`: silence per read,
a deadline per request and per phase), an answer read only up to what a valid one can
take, a redirect refused. Every failure is one line that names the server's role and the
exact URL asked (``ground truth server http://host:30000/generate answered HTTP 500 ...``)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from remote.errors import UserError
from remote.protocol import GTLimits

# Who answers, as every error line names it (before the URL asked).
ROLE = "ground truth server"

# What a valid answer can take: per token (prompt ids an OpenAI server echoes, completion
# ids, and in ``text`` the token's piece, which real vocabularies keep under ~256 bytes,
# JSON-escaped up to 6x) and a fixed part (meta_info, usage, ids of the request). An answer
# past its bound is refused before it is parsed: unbounded, 16 hostile answers of 286 MiB
# in flight took 13 GiB here (benchmarks/memory.py --only groundtruth).
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
    role: str = ROLE,
) -> Any:
    """POST (or GET when `payload` is None) JSON and parse the answer (`http_body`, whose
    arguments these are); malformed JSON is one UserError naming `role` and `url`."""
    body = http_body(
        url, payload, timeout, deadline=deadline, waits=waits, max_bytes=max_bytes, role=role
    )
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        snippet = body[:80].decode(errors="replace").replace("\n", " ")
        raise UserError(f"{role} {url} returned malformed JSON: {snippet!r}") from None


def http_body(
    url: str,
    payload: dict | None,
    timeout: float,
    *,
    deadline: Deadline | None = None,
    waits: Waits | None = None,
    max_bytes: int = INFO_ANSWER_BYTES,
    role: str = ROLE,
) -> bytes:
    """POST (or GET when `payload` is None) JSON; the answer's body. Every failure is one
    clear UserError naming `url`. `timeout`: seconds of silence on one read; `deadline`:
    when the whole exchange must have ended (connect to the answer's last byte; default:
    `timeout` from now), watched through `waits` when given (`Waits.abort` ends it too).
    `max_bytes`: the answer's bound, checked against its Content-Length and as it is read,
    before anyone parses it. A redirect is refused, never followed: the ground truth is what
    THIS server answers, the cache is keyed by its URL, and following one would let any
    server make this host send requests elsewhere. Every line names `role` and `url`."""
    deadline = deadline or Deadline(time.monotonic() + timeout, f"its timeout of {timeout:g}s")
    dog = waits.watch(deadline) if waits else _Watchdog(deadline.at)
    try:
        status, reason, location, body = _exchange(
            url, payload, timeout, deadline, dog, max_bytes, role
        )
    except UserError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if dog.expired or time.monotonic() >= deadline.at:
            raise UserError(
                f"{role} {url} had not finished answering at {deadline.words}"
            ) from None
        raise UserError(_connection_problem(role, url, exc, timeout)) from None
    finally:
        if waits:
            waits.release(dog)
        else:
            dog.close()
    if dog.expired:  # a body cut short by the shutdown can still look whole
        raise UserError(f"{role} {url} had not finished answering at {deadline.words}")
    if 300 <= status < 400:
        raise Redirected(
            f"{role} {url} redirected (HTTP {status} {reason}) to "
            f"{_printable(location or '(no Location)')}; redirects are not followed: point "
            "dflash at the server that answers"
        )
    if status >= 400:
        detail = _printable(body.decode(errors="replace").strip(), ERROR_DETAIL_BYTES)
        raise UserError(
            f"{role} {url} answered HTTP {status} {reason}{': ' + detail if detail else ''}"
        )
    return body


def _exchange(
    url: str,
    payload: dict | None,
    timeout: float,
    deadline: Deadline,
    dog: _Watchdog,
    max_bytes: int,
    role: str,
) -> tuple[int, str, str | None, bytes]:
    """(status, reason, Location, body) of one request over its own connection (plain
    http.client: no redirect is followed, no proxy from the environment is used), the
    socket watched by `dog` from the moment it connects."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(_not_http(role, url))
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
        # Closed whatever happens: an answer that ends with its connection hands the
        # socket to the response, which a refusal's traceback would otherwise keep open
        # (and the server writing into it) for as long as the error lives.
        with closing(conn.getresponse()) as resp:
            return _answer(resp, url, max_bytes, role)
    finally:
        conn.close()


def _answer(
    resp: http.client.HTTPResponse, url: str, max_bytes: int, role: str
) -> tuple[int, str, str | None, bytes]:
    """(status, reason, Location, body) of `resp`, the body read up to `max_bytes`."""
    location = resp.getheader("Location")
    if 300 <= resp.status < 400:
        return resp.status, resp.reason, location, b""
    if resp.status >= 400:
        return resp.status, resp.reason, location, resp.read(ERROR_DETAIL_BYTES)
    declared = resp.getheader("Content-Length")
    if declared and declared.strip().isdigit() and int(declared) > max_bytes:
        raise UserError(_too_big(role, url, f"announces {int(declared)} bytes", max_bytes))
    body = resp.read(max_bytes + 1)
    if len(body) > max_bytes:
        raise UserError(_too_big(role, url, f"sent more than {max_bytes} bytes", max_bytes))
    return resp.status, resp.reason, location, body


def _not_http(role: str, url: str) -> str:
    return f"{role} URL {url!r} is not an http(s) URL"


def _too_big(role: str, url: str, what: str, max_bytes: int) -> str:
    return (
        f"{role} {url} {what}, larger than any answer to this request can be "
        f"({max_bytes} bytes for this request); refused before it was parsed, nothing "
        "was kept"
    )


def _connection_problem(role: str, url: str, exc: BaseException, timeout: float) -> str:
    """The line for a request that failed on the way (no deadline passed)."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"{role} {url} did not answer within {timeout:g}s (timed out)"
    if isinstance(exc, ConnectionRefusedError):
        return (
            f"{role} {url} refused the connection; is it running and "
            "listening there (from the eval host's view)?"
        )
    if isinstance(exc, socket.gaierror):
        return f"{role} {url} is unreachable: {exc.strerror or exc}"
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError):
        return f"{role} {url} sent a broken HTTP answer: {_printable(repr(exc))}"
    return f"{role} {url} dropped the connection: {exc}"


def reachable(url: str, timeout: float = 5.0, role: str = ROLE) -> str | None:
    """None when something accepts TCP connections at the URL's host and port, else why
    (one line naming `role` and `url`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return _not_http(role, url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return f"{role} {url} refused the connection from this host; is it running?"
    except TimeoutError:
        return f"{role} {url} did not accept a connection within {timeout:g}s"
    except OSError as exc:
        return f"{role} {url} is unreachable from this host: {exc.strerror or exc}"
