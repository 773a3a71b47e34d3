"""The host side's one HTTP client: every wait and answer bounded, redirects refused, each
failure one line naming the server's role and URL (docs/eval.md)."""

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

ROLE = "ground truth server"

# what a valid answer can take, a fixed part and per token (docs/eval.md)
ANSWER_BASE_BYTES = 1 << 20

ANSWER_BYTES_PER_TOKEN = 2048

INFO_ANSWER_BYTES = 1 << 20  # GET /get_model_info, /v1/models

ERROR_DETAIL_BYTES = 300


def answer_bytes(prompt_tokens: int, max_new: int) -> int:
    """The most bytes a valid answer for `prompt_tokens` ids and `max_new` new ones takes."""
    return ANSWER_BASE_BYTES + ANSWER_BYTES_PER_TOKEN * (prompt_tokens + max_new)


class Redirected(UserError):
    """A server answered a redirect (refused, never followed)."""


@dataclass(frozen=True)
class Deadline:
    """When (monotonic) a request must have ended, and the words saying which setting to
    raise."""

    at: float
    words: str


class Waits:
    """One ground-truth phase's waits: each request ends at its deadline or the phase's;
    `abort` ends every request in flight."""

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
    """Shuts one connection down at its deadline however the server trickles (through a
    dup of its socket, so under TLS too); `expired` says why a read ended."""

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
    """A server's words fit for one line: control characters escaped, cut at `limit`."""
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
    """`http_body`'s answer parsed as JSON; malformed JSON is one `UserError`."""
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
    """POST (GET when `payload` is None) JSON; the answer's body, at most `max_bytes`.
    `timeout`: silence per read; `deadline`: the whole exchange (default `timeout`)."""
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
    if dog.expired:  # a body cut short can still look whole
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
    """(status, reason, Location, body) of one request over its own connection (no proxy,
    no redirect), watched by `dog` from the connect."""
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
        # closed whatever happens: a refusal's traceback would keep the socket open
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
    """None when something accepts TCP connections at the URL, else why in one line."""
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
