"""A loopback HTTP server answering what a test scripts, in SGLang's and OpenAI's dialects:
the failures a real engine rarely shows on demand, and servers that lie about HTTP (`Raw`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.demo.gtserver import JSONHandler, LoopbackServer

Reply = Callable[[str, dict], Any]


def ids_reply(ids: list) -> Reply:
    """Every POST answered with these completion ids, in both dialects."""

    def reply(path: str, body: dict) -> Any:
        if path == "/generate":
            return {"text": "", "output_ids": ids, "meta_info": {"finish_reason": "length"}}
        return {
            "choices": [
                {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": body.get("prompt")}
            ]
        }

    return reply


@dataclass
class Raw:
    """An answer written byte for byte, `chunk` bytes after each `pause`; without `length`
    the body ends when the connection closes."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    length: bool = True
    chunk: int = 1 << 16
    pause: float = 0.0

    def wire(self) -> bytes:
        head = [f"HTTP/1.1 {self.status} Scripted", "Connection: close"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        if self.length:
            head.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


def redirect(location: str, status: int = 302) -> Raw:
    """A redirect to `location`, as a proxy or a hostile server may answer."""
    return Raw(status=status, headers={"Location": location})


def as_json(obj: Any, **raw: Any) -> Raw:
    """`obj` as a JSON answer written the `Raw` way."""
    return Raw(json.dumps(obj).encode(), headers={"Content-Type": "application/json"}, **raw)


class ScriptedServer(LoopbackServer):
    """Answers each POST with `reply(path, body)` (JSON or `Raw`), a GET with `get_reply`
    or the defaults; logs ``requests``, ``gets`` and the bytes ``sent`` of each `Raw`."""

    def __init__(
        self,
        reply: Reply | None = None,
        model_path: str | None = "/models/a",
        get_reply: Callable[[str], Any] | None = None,
        port: int = 0,
    ):
        self.reply = reply or ids_reply([5, 6, 7])
        self.get_reply = get_reply
        self.model_path = model_path
        self.requests: list[tuple[str, dict]] = []
        self.gets: list[str] = []
        self.sent: list[int] = []
        self._sent_changed = threading.Condition()
        super().__init__(self._handler(), port)

    def wait_sent(self, count: int = 1, timeout: float = 30.0) -> list[int]:
        """``sent`` once `count` `Raw` answers are written (a client may return before its
        handler is done), or as it is after `timeout`."""
        with self._sent_changed:
            self._sent_changed.wait_for(lambda: len(self.sent) >= count, timeout)
            return list(self.sent)

    def _record_sent(self, done: int) -> None:
        with self._sent_changed:
            self.sent.append(done)
            self._sent_changed.notify_all()

    def _handler(self):
        server = self

        class Handler(JSONHandler):
            def _answer(self, answer: Any) -> None:
                if not isinstance(answer, Raw):
                    self._json(answer)
                    return
                data, done = answer.wire(), 0
                try:
                    while done < len(data):
                        if answer.pause:
                            time.sleep(answer.pause)
                        self.wfile.write(data[done : done + answer.chunk])
                        self.wfile.flush()
                        done = min(len(data), done + answer.chunk)
                except OSError:  # the client hung up
                    pass
                finally:
                    server._record_sent(done)
                    self.close_connection = True

            def do_GET(self):
                server.gets.append(self.path)
                scripted = server.get_reply(self.path) if server.get_reply else None
                if scripted is not None:
                    self._answer(scripted)
                elif self.path == "/get_model_info" and server.model_path:
                    self._json({"model_path": server.model_path, "is_generation": True})
                elif self.path == "/v1/models" and server.model_path:
                    self._json(
                        {
                            "object": "list",
                            "data": [
                                {"id": "served", "object": "model", "root": server.model_path}
                            ],
                        }
                    )
                else:
                    self._json({"detail": "Not Found"}, 404)

            def do_POST(self):
                if (body := self._body()) is None:
                    return
                server.requests.append((self.path, body))
                self._answer(server.reply(self.path, body))

        return Handler


class BatchedReply:
    """Answers concurrent requests in batches, as a GPU serving engine does: those within
    `window` of the first answer together, `latency` after; ``batches`` and ``peak`` count."""

    def __init__(self, inner: Reply, latency: float, window: float = 0.01):
        self.inner, self.latency, self.window = inner, latency, window
        self.batches: list[int] = []
        self.peak = 0
        self._lock = threading.Lock()
        self._open: dict | None = None
        self._in_flight = 0

    def __call__(self, path: str, body: dict) -> Any:
        with self._lock:
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
            batch = self._open
            if batch is None:
                batch = self._open = {"size": 0, "done": threading.Event()}
                threading.Thread(target=self._run, args=(batch,), daemon=True).start()
            batch["size"] += 1
        batch["done"].wait()
        try:
            return self.inner(path, body)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _run(self, batch: dict) -> None:
        time.sleep(self.window)
        with self._lock:
            self._open = None
            self.batches.append(batch["size"])
        time.sleep(self.latency)
        batch["done"].set()
