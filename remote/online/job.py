"""An ``online`` job: a real serving engine beside the offline walk (docs/online.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from remote.atomic import write_json_atomic
from remote.errors import UserError
from remote.eval.job import Events, job_engine, run_eval_job, run_preflight
from remote.online import report, verdict
from remote.online.server import (
    Server,
    engine_version,
    free_port,
    serve_threads,
    vllm_command,
    vllm_env,
    wait_answering,
)
from remote.online.spec import MeasureSpec, ServeError, ServeSpec, sampled_problem
from remote.protocol import EvalSpec, Sampling

VERDICT_FILE = "verdict.json"
ENGINE_COMPLETIONS = "engine_completions.jsonl"  # above temperature 0: what was walked
SERVER_LOG = "server.log"
BASELINE_LOG = "baseline.log"
# `--draft-policy` in vLLM's speculative config (absent: its default, greedy)
VLLM_DRAFT_SAMPLE_METHOD = {"sample": "probabilistic"}
MIN_NUM_SEQS = 8  # a started server's --max-num-seqs, raised to the highest concurrency


def serve_of(spec: dict) -> tuple[ServeSpec, MeasureSpec]:
    """The job's ``serve`` and ``measure`` entries, checked as the controller checked them."""
    try:
        return ServeSpec.from_json(spec.get("serve")), MeasureSpec.from_json(spec.get("measure"))
    except ServeError as exc:
        raise UserError(f"job spec: {exc}") from None


def check_python(python: str, engine: str) -> str:
    """`python` if it is an executable file here; else one line saying what to set."""
    py = os.path.expanduser(python)
    if not (os.path.isfile(py) and os.access(py, os.X_OK)):
        raise UserError(
            f"serving engine python {python} is not an executable file on this host; "
            "set roles.eval.serve.python in the inventory to the python of a venv with "
            f"{engine} (scripts/setup-vllm.sh builds one)"
        )
    return py


def check_serve(serve: ServeSpec, measure: MeasureSpec | None = None) -> dict[str, Any]:
    """The serving engine's host check (python or server); one line when not."""
    from remote.eval.groundtruth import reachable

    measure = measure or MeasureSpec()
    if measure.baseline_python is not None:
        check_python(measure.baseline_python, serve.engine)
    for url, role in ((measure.baseline_url, "baseline server"), (serve.url, "serving engine")):
        problem = reachable(url, role=role) if url is not None else None
        if problem:
            raise UserError(problem)
    if serve.python is not None:
        return {"engine": serve.engine, "python": check_python(serve.python, serve.engine)}
    return {"engine": serve.engine, "url": serve.url}


def run_job(path: Path, spec: dict, events: Events, *, preflight: bool = False) -> int:
    """The online job in the folder `path` (docs/online.md)."""
    serve, measure = serve_of(spec)
    engine = job_engine(spec)
    problem = sampled_problem(engine.temperature, serve.engine, measure)
    if problem:
        raise UserError(f"job spec: {problem}")
    sampling = Sampling.from_json(spec.get("sampling")) if engine.sampled else None
    checked: dict = {}
    if preflight:
        try:
            check_serve(serve, measure)
        except UserError as exc:
            write_json_atomic(path / "preflight.json", {"ok": False, "error": str(exc)})
            raise
        run_preflight(path, spec, engine, checked, events)
    from remote.eval.drafter_config import read_config

    drafter = read_config(engine.drafter)
    threads = serve_threads(engine.threads)
    box: dict[str, Any] = {}

    def start_server(gt_path: str) -> str | None:
        box["rows"] = _rows(gt_path, engine)
        if serve.python is not None:
            box["server"] = _start_vllm(
                path / SERVER_LOG,
                serve.python,
                serve,
                engine,
                box["rows"],
                measure,
                threads,
                events,
                k=drafter.block_size - 1,
                policy=engine.draft_policy if sampling else None,
            )
            box["max_model_len"] = model_len(box["rows"], drafter.block_size - 1)
        if sampling is None:
            return None
        # above temperature 0 the engine's own sampled completions are what is walked
        box["measured"] = _measure(path, serve, measure, box, events, drafter.vocab_size, sampling)
        box["rows"] = _engine_rows(box["rows"], box["measured"]["levels"][0]["samples"])
        out = path / ENGINE_COMPLETIONS
        out.write_text("".join(json.dumps(r) + "\n" for r in box["rows"]))
        return str(out)

    try:
        run_eval_job(
            path, spec, events, engine, checked.get("plan"), after_ground_truth=start_server
        )
        measured = box.get("measured") or _measure(path, serve, measure, box, events)
    finally:
        if "server" in box:
            box["server"].stop()
    baseline = _baseline(path, serve, measure, engine, box, threads, events)
    if serve.python is not None:
        measured["server"].update(threads=threads[0], threads_from=threads[1])
    result = report.build(
        box["rows"],
        _offline(path),
        measured,
        baseline,
        block_size=drafter.block_size,
        offline_dtype=engine.dtype,
        online_dtype=engine.dtype if serve.python is not None else None,
    )
    if sampling is not None:
        from remote.online.distribution import judge
        from remote.online.expected import job_pmfs

        events.emit("phase", phase="expectation", samples=len(box["rows"]))
        policy = {"seed": sampling.seed, "draft_policy": engine.draft_policy}
        judge(result, job_pmfs(engine, box["rows"]), {**sampling.engine(), **policy})
    else:
        _test_deviations(result, serve, engine, drafter.num_layers, box["rows"], events)
    write_json_atomic(path / VERDICT_FILE, result)
    events.emit(
        "verdict",
        verdict=result["verdict"],
        offline_tau=result["offline"]["tau_token_weighted"],
        online_tau=(result["online"] or {}).get("tau_token_weighted"),
        message=result["diagnosis"][0]["detail"],
    )
    return 0


def _rows(gt_path: str, engine: EvalSpec) -> list[dict]:
    from remote.eval.inputs import read_ground_truth

    # the engine checks the ids against the vocabulary; here only selection and lengths matter
    return read_ground_truth(gt_path, 1 << 62, engine.max_samples)


def _engine_rows(rows: list[dict], samples: list[dict]) -> list[dict]:
    """`rows` with the engine's completions in place of theirs."""
    got = {s["id"]: s["token_ids"] for s in samples}
    return [{**r, "completion_ids": got[r["id"]]} for r in rows]


def _offline(path: Path) -> list[dict]:
    text = (path / "samples.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def model_len(rows: list[dict], k: int | None) -> int:
    """A started server's max_model_len: the longest sample, its last round's drafts, a margin."""
    return max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows) + (k or 0) + 16


def _start_vllm(
    log: Path,
    python: str,
    serve: ServeSpec,
    engine: EvalSpec,
    rows: list[dict],
    measure: MeasureSpec,
    threads: tuple[int, str],
    events: Events,
    *,
    k: int | None,
    phase: str = "serve",
    policy: str | None = None,
) -> Server:
    """vLLM serving the target drafting `k` tokens (None: baseline), long enough for all."""
    port = free_port()
    argv = vllm_command(
        os.path.expanduser(python),
        engine.target,
        port,
        drafter=None if k is None else engine.drafter,
        num_speculative_tokens=k,
        dtype=engine.dtype,
        max_model_len=model_len(rows, k),
        max_num_seqs=max(MIN_NUM_SEQS, *measure.concurrency),
        draft_sample_method=VLLM_DRAFT_SAMPLE_METHOD.get(policy),
    )
    events.emit(
        "phase",
        phase=phase,
        source=serve.engine,
        port=port,
        threads=threads[0],
        threads_from=threads[1],
    )
    return Server(argv, vllm_env(serve.kv_cache_gib, threads[0]), log, f"http://127.0.0.1:{port}")


def _levels(
    url: str,
    serve: ServeSpec,
    measure: MeasureSpec,
    rows: list[dict],
    vocab: int,
    events: Events,
    phase: str,
    sampling: Sampling | None = None,
) -> list[dict[str, Any]]:
    """Every prompt through the server at each concurrency level in turn."""
    if serve.engine == "sglang":
        from remote.online import sglang as client
    else:
        from remote.online import vllm as client
    out = []
    for c in measure.concurrency:
        events.emit("phase", phase=phase, source=serve.engine, concurrency=c)

        def done(n: int, total: int, c: int = c) -> None:
            events.emit("online_sample", done=n, total=total, concurrency=c, phase=phase)

        got = client.measure(
            url,
            rows,
            vocab,
            model=serve.model,
            timeout=serve.request_timeout,
            concurrency=c,
            on_done=done,
            **({"sampling": sampling} if sampling is not None else {}),
        )
        out.append({"concurrency": c, **got})
    return out


def _measure(
    path: Path,
    serve: ServeSpec,
    measure: MeasureSpec,
    box: dict,
    events: Events,
    vocab: int | None = None,
    sampling: Sampling | None = None,
) -> dict[str, Any]:
    """Every ground-truth prompt through the serving engine once it answers, at each level."""
    server = box.get("server")
    url = server.url if server is not None else str(serve.url)
    events.emit("phase", phase="serve_wait")
    if server is not None:
        startup = server.wait_ready(serve.start_timeout)
    else:
        wait_answering(url, serve.start_timeout)
        startup = None
    vocab = vocab or _vocab(path)
    levels = _levels(url, serve, measure, box["rows"], vocab, events, "online", sampling)
    return {
        "levels": levels,
        "server": {
            "engine": serve.engine,
            "started_here": server is not None,
            "url": url,
            "startup_s": startup,
            "version": engine_version(url) if serve.engine == "vllm" else None,
            "platform": server.platform() if server is not None else None,
            "max_model_len": box.get("max_model_len"),
        },
    }


def _baseline(
    path: Path,
    serve: ServeSpec,
    measure: MeasureSpec,
    engine: EvalSpec,
    box: dict,
    threads: tuple[int, str],
    events: Events,
) -> dict[str, Any] | None:
    """The same prompts and levels without the drafter (started here, or running)."""
    if not measure.baseline:
        return None
    server = None
    if measure.baseline_python is not None:
        server = _start_vllm(
            path / BASELINE_LOG,
            measure.baseline_python,
            serve,
            engine,
            box["rows"],
            measure,
            threads,
            events,
            k=None,
            phase="baseline_serve",
        )
    try:
        startup = None
        if server is not None:
            events.emit("phase", phase="baseline_wait")
            startup = server.wait_ready(serve.start_timeout)
        url = server.url if server is not None else str(measure.baseline_url)
        if server is None:
            wait_answering(url, serve.start_timeout)
        levels = _levels(url, serve, measure, box["rows"], _vocab(path), events, "baseline")
    finally:
        if server is not None:
            server.stop()
    return {"levels": levels, "started_here": server is not None, "url": url, "startup_s": startup}


def _test_deviations(
    result: dict,
    serve: ServeSpec,
    engine: EvalSpec,
    layers: int,
    rows: list[dict],
    events: Events,
) -> None:
    """Where rounds differ, the known engine deviations tested (torch: imported here)."""
    if not verdict.disagreeing(result):
        return
    from remote.online.simulate import check_deviations

    check_deviations(result, serve.engine, engine, layers, rows, emit=events.emit)


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
