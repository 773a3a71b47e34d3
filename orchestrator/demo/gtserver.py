"""A loopback ground-truth server (SGLang ``/generate``, OpenAI ``/v1/completions``) that
answers with real greedy generation; ``mode`` switches on a real server's failures.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Greedy:
    """A tiny transformers model (float32, KV cache) answering greedy continuations."""

    def __init__(self, model_dir: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.model_dir = str(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._lock = threading.Lock()  # one generate at a time: the HTTP server is threaded

    def __call__(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        return self.batch([prompt_ids], max_new_tokens)[0]

    def batch(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuations of equal-length prompts (no padding: each row as unbatched)."""
        torch = self.torch
        if len({len(p) for p in prompts}) != 1:
            raise ValueError("batched prompts must have equal lengths")
        ids = torch.tensor(prompts)
        with self._lock, torch.inference_mode():
            out = self.model.generate(
                ids,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                attention_mask=torch.ones_like(ids),
            )
        return out[:, ids.shape[1] :].tolist()


class _Server(ThreadingHTTPServer):
    # socketserver's shallow default backlog overflowed under concurrent ground-truth
    # requests and the kernel reset one; serving engines listen deep, so does this.
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        # A client that gave up is its own business: no broken-pipe traceback mid-test.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LoopbackServer:
    """Serves a handler class on 127.0.0.1 in a daemon thread until `stop` (or ``with``)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0):
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving and close the socket; returns when the serving thread has ended."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


class JSONHandler(BaseHTTPRequestHandler):
    """A quiet handler answering bytes or a JSON document, with its length."""

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj, code: int = 200) -> None:
        self._send(code, json.dumps(obj).encode())

    def _body(self) -> dict | None:
        """The request's JSON object; None once a 400 has answered a body that is not one
        (as a serving engine does: a cut or empty request is the client's fault)."""
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError as exc:
            body = exc
        if isinstance(body, dict):
            return body
        self._json({"error": f"the request body is not a JSON object: {body}"}, 400)
        return None


class GroundTruthServer(LoopbackServer):
    """The HTTP server over a `Greedy` model (a folder path loads one). `stop()` ends it."""

    def __init__(self, model: str | Greedy, model_name: str = "tiny-target"):
        self.greedy_model = model if isinstance(model, Greedy) else Greedy(model)
        self.model = self.greedy_model.model
        self.tokenizer = self.greedy_model.tokenizer
        self.model_name = model_name
        self.model_path = self.greedy_model.model_dir
        self.mode = "ok"
        self.delay = 5.0
        self.requests: list[tuple[str, dict]] = []
        super().__init__(self._handler())

    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        return self.greedy_model(prompt_ids, max_new_tokens)

    def _handler(self):
        server = self

        class Handler(JSONHandler):
            def _failure(self) -> bool:
                if server.mode == "500":
                    self._send(500, b'{"error": "CUDA out of memory"}')
                    return True
                if server.mode == "malformed":
                    self._send(200, b"<html>upstream proxy error</html>", "text/html")
                    return True
                if server.mode == "slow":
                    time.sleep(server.delay)
                return False

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": server.model_name,
                                    "object": "model",
                                    "root": server.model_path,
                                }
                            ],
                        }
                    )
                elif self.path == "/get_model_info":
                    self._json(
                        {
                            "model_path": server.model_path,
                            "tokenizer_path": server.model_path,
                            "is_generation": True,
                        }
                    )
                elif self.path in ("/health", "/"):
                    self._json({"status": "ok"})
                else:
                    self._send(404, b'{"detail": "Not Found"}')

            def do_POST(self):
                if (body := self._body()) is None:
                    return
                server.requests.append((self.path, body))
                if self._failure():
                    return
                if self.path == "/generate":
                    self._generate(body)
                elif self.path == "/v1/completions":
                    self._completions(body)
                else:
                    self._send(404, b'{"detail": "Not Found"}')

            def _generate(self, body):
                params = body.get("sampling_params") or {}
                ids = body["input_ids"]
                out = server.greedy(ids, int(params.get("max_new_tokens", 128)))
                self._json(
                    {
                        "text": server.tokenizer.decode(out),
                        "output_ids": out,
                        "meta_info": {
                            "id": "req-1",
                            "prompt_tokens": len(ids),
                            "completion_tokens": len(out),
                            "finish_reason": {"type": "length"},
                        },
                    }
                )

            def _completions(self, body):
                prompt = body["prompt"]
                if "model" in body and body["model"] != server.model_name:
                    self._json({"error": {"message": f"model {body.get('model')} not found"}}, 404)
                    return
                if isinstance(prompt, str):
                    # Text servers tokenise the prompt themselves (transformers serve does).
                    ids = server.tokenizer(prompt, add_special_tokens=False)["input_ids"]
                else:
                    ids = list(prompt)
                out = server.greedy(ids, int(body.get("max_tokens", 16)))
                choice = {
                    "index": 0,
                    "text": server.tokenizer.decode(out, skip_special_tokens=True),
                    "logprobs": None,
                    "finish_reason": "length",
                }
                if body.get("return_token_ids") and server.mode != "text_only":
                    choice["prompt_token_ids"] = ids
                    choice["token_ids"] = out
                self._json(
                    {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "created": 0,
                        "model": server.model_name,
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": len(ids),
                            "completion_tokens": len(out),
                            "total_tokens": len(ids) + len(out),
                        },
                    }
                )

        return Handler
