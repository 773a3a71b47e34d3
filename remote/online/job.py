"""An ``online`` job, as the job runner (`remote.jobs.run`) runs it: the checkpoint served
by a real serving engine beside dflash's offline walk, on the same prompts and ground
truth, and one verdict.

1. The host checks (an eval's, and the serving engine's python or URL).
2. The ground truth, as an eval makes it (`remote.eval.job.run_eval_job`); once it is
   there, the server starts (``serve.python``: vLLM on a free loopback port of this host,
   the target with the checkpoint as its DFlash drafter, ``num_speculative_tokens`` =
   block size - 1) while the offline engine walks the same samples (chain only).
3. Each ground-truth prompt is sent as token ids, greedy, for exactly its completion's
   length (`remote.online.vllm` or `remote.online.sglang`), one request at a time.
4. ``verdict.json`` (`remote.online.verdict`): tau both ways, cut the same way, per
   position and per sample, lossless, and a diagnosis; with what served it.

The server is stopped however the job ends: here on success or error (TERM, then KILL,
every process below it), and by ``job cancel`` with the job's process group, which it
stays in. Its log is ``server.log``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.eval.job import Events, job_engine, run_eval_job, run_preflight
from remote.online import verdict
from remote.online.server import Server, free_port, vllm_command, vllm_env
from remote.online.spec import ServeError, ServeSpec
from remote.protocol import EvalSpec

VERDICT_FILE = "verdict.json"
SERVER_LOG = "server.log"


def serve_of(spec: dict) -> ServeSpec:
    """The job's ``serve`` entry, checked as the controller checked it."""
    try:
        return ServeSpec.from_json(spec.get("serve"))
    except ServeError as exc:
        raise UserError(f"job spec: {exc}") from None


def check_serve(serve: ServeSpec) -> dict[str, Any]:
    """The serving engine's host check: its python is an executable file here, or its
    server accepts connections from here. One line when not."""
    if serve.python is not None:
        py = os.path.expanduser(serve.python)
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            raise UserError(
                f"serving engine python {serve.python} is not an executable file on this host; "
                "set roles.eval.serve.python in the inventory to the python of a venv with "
                f"{serve.engine} (scripts/setup-vllm.sh builds one)"
            )
        return {"engine": serve.engine, "python": py}
    from remote.eval.groundtruth import reachable

    problem = reachable(serve.url, role="serving engine")
    if problem:
        raise UserError(problem)
    return {"engine": serve.engine, "url": serve.url}


def run_job(path: Path, spec: dict, events: Events, *, preflight: bool = False) -> int:
    """The online job in the folder `path` (see the module docstring)."""
    serve = serve_of(spec)
    engine = job_engine(spec)
    checked: dict = {}
    if preflight:
        try:
            check_serve(serve)
        except UserError as exc:
            write_json_atomic(path / "preflight.json", {"ok": False, "error": str(exc)})
            raise
        run_preflight(path, spec, engine, checked)
    from remote.eval.drafter_config import read_config

    block = read_config(engine.drafter).block_size
    box: dict[str, Any] = {}

    def start_server(gt_path: str) -> None:
        box["rows"] = _rows(gt_path, engine)
        if serve.python is not None:
            box["server"] = _start_vllm(path, serve, engine, box["rows"], block - 1, events)

    try:
        run_eval_job(
            path, spec, events, engine, checked.get("plan"), after_ground_truth=start_server
        )
        measured = _measure(path, serve, box, events)
    finally:
        if "server" in box:
            box["server"].stop()
    result = _verdict(path, serve, engine, box["rows"], measured, block)
    events.emit(
        "verdict",
        verdict=result["verdict"],
        offline_tau=result["offline"]["tau_token_weighted"],
        online_tau=(result["online"] or {}).get("tau_token_weighted"),
        message=result["diagnosis"][0]["detail"],
    )
    return 0


def _rows(gt_path: str, engine: EvalSpec) -> list[dict]:
    from remote.eval.engine import read_ground_truth

    # The ids are checked against the target's vocabulary by the engine; here only the
    # selection and its lengths matter.
    return read_ground_truth(gt_path, 1 << 62, engine.max_samples)


def _start_vllm(
    path: Path, serve: ServeSpec, engine: EvalSpec, rows: list[dict], k: int, events: Events
) -> Server:
    """vLLM serving the target with the checkpoint as its DFlash drafter, on a free
    loopback port, long enough for the longest sample and a last verify step past it."""
    longest = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    port = free_port()
    argv = vllm_command(
        os.path.expanduser(serve.python or ""),
        engine.target,
        port,
        drafter=engine.drafter,
        num_speculative_tokens=k,
        dtype=engine.dtype,
        max_model_len=longest + k + 16,
    )
    events.emit("phase", phase="serve", source=serve.engine, port=port)
    return Server(
        argv,
        vllm_env(serve.kv_cache_gib, engine.threads),
        path / SERVER_LOG,
        f"http://127.0.0.1:{port}",
    )


def _measure(path: Path, serve: ServeSpec, box: dict, events: Events) -> dict[str, Any]:
    """Every ground-truth prompt through the serving engine (once it answers)."""
    rows = box["rows"]
    vocab = _vocab(path)
    server = box.get("server")
    url = server.url if server is not None else str(serve.url)
    startup = None
    if server is not None:
        events.emit("phase", phase="serve_wait")
        startup = server.wait_ready(serve.start_timeout)
    events.emit("phase", phase="online", source=serve.engine)
    if serve.engine == "sglang":
        from remote.online import sglang as client
    else:
        from remote.online import vllm as client
    out = client.measure(
        url,
        rows,
        vocab,
        model=serve.model,
        timeout=serve.request_timeout,
        on_done=lambda done, total: events.emit("online_sample", done=done, total=total),
    )
    out["server"] = {
        "engine": serve.engine,
        "started_here": server is not None,
        "url": url,
        "startup_s": startup,
    }
    return out


def _vocab(path: Path) -> int:
    try:
        result = json.loads((path / "result.json").read_text())
        vocab = result["inputs"]["target_vocab_size"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            "the offline engine left no result.json naming the target's vocabulary"
        ) from None
    if not isinstance(vocab, int) or vocab < 1:
        raise UserError(f"result.json names a target vocabulary of {vocab!r}")
    return vocab


def _verdict(
    path: Path, serve: ServeSpec, engine: EvalSpec, rows: list[dict], measured: dict, block: int
) -> dict:
    offline = [
        json.loads(line)
        for line in (path / "samples.jsonl").read_text().splitlines()
        if line.strip()
    ]
    result = verdict.compare(
        rows,
        offline,
        measured["samples"],
        block_size=block,
        offline_dtype=engine.dtype,
        online_dtype=engine.dtype if serve.python is not None else None,
    )
    result["server"] = {
        **measured["server"],
        "seconds": measured["seconds"],
        "tokens": measured["tokens"],
        "counters": measured.get("counters"),
        "counters_expected": measured.get("counters_expected"),
        "counters_agree": measured.get("counters_agree"),
    }
    result["engine_costs"] = verdict.engine_costs(
        measured.get("decode"), rows, measured.get("counters")
    )
    # what the engine said per sample, less the ids (`per_sample` says whether they matched)
    result["online_samples"] = [
        {k: v for k, v in r.items() if k != "token_ids"} for r in measured["samples"]
    ]
    result["created"] = time.time()
    write_json_atomic(path / VERDICT_FILE, result)
    return result
