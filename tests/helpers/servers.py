"""A real HTTP server on loopback that answers what a test tells it to: SGLang's native
``POST /generate`` and ``GET /get_model_info``, OpenAI-compatible ``POST /v1/completions``
and ``GET /v1/models``. For the failures a real engine rarely shows on demand (ids outside
the vocabulary, a sampled answer, another model behind the same URL), where the demo's
`GroundTruthServer` always answers correctly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


class ScriptedServer(LoopbackServer):
    """`reply(path, body)` makes each POST's JSON answer; `model_path` is the model the
    server reports (None: it reports none, 404). ``requests`` logs the POSTs."""

    def __init__(self, reply: Reply | None = None, model_path: str | None = "/models/a"):
        self.reply = reply or ids_reply([5, 6, 7])
        self.model_path = model_path
        self.requests: list[tuple[str, dict]] = []
        super().__init__(self._handler())

    def _handler(self):
        server = self

        class Handler(JSONHandler):
            def do_GET(self):
                if self.path == "/get_model_info" and server.model_path:
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
                body = self._body()
                server.requests.append((self.path, body))
                self._json(server.reply(self.path, body))

        return Handler


class BatchedReply:
    """A reply that answers concurrent requests in batches, as a GPU serving engine does:
    the first request opens a batch, requests arriving within `window` seconds join it, and
    the whole batch answers `latency` seconds after it closes (one batched forward costs
    about what one request's does). `inner(path, body)` makes each answer. ``batches``
    holds each batch's size; ``peak`` the most requests in flight at once."""

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
            self._open = None  # later arrivals open the next batch
            self.batches.append(batch["size"])
        time.sleep(self.latency)
        batch["done"].set()
