"""The ground-truth phase of a job (`prepare`): read the job once
(`remote.eval.preflight.read_job`), then one
function per source kind: a host's file (`from_file`), a serving engine (`from_server`), the
target itself (`from_local`). Both of the last two make completions of the job's rendered
prompts (`completions.Prompts`), reuse a cache entry that still passes every check, and
check every completion before anything is cached (`completions.collect`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic
from remote.errors import UserError
from remote.eval.groundtruth.cache import Emit, jsonl
from remote.eval.groundtruth.checks import (
    read_ground_truth_file,
)
from remote.eval.groundtruth.completions import Prompts, collect, job_info, require_source
from remote.eval.groundtruth.local import LocalGenerator
from remote.eval.groundtruth.prompts import (
    select,
)
from remote.eval.groundtruth.servers import (
    endpoint,
    in_order,
    openai_completion_ids,
    openai_completion_text,
    served_model,
    sglang_generate,
)
from remote.eval.preflight import read_job
from remote.httpclient import Waits, reachable
from remote.protocol import SERVER_KINDS, EvalSpec, JobSpec


def prepare(
    spec: dict | JobSpec,
    emit: Emit = lambda *a, **k: None,
    engine: EvalSpec | None = None,
    load_model: Callable[[], Any] | None = None,
    asking: Callable[[], None] | None = None,
) -> tuple[str, dict]:
    """Make (or reuse) the ground truth the job asks for. The target (its tokenizer, and for
    kind ``local`` its dtype and threads) is the job's EvalSpec's (``eval``); `spec`: the
    job document, or the `JobSpec` the caller read from it; `engine`: the job's EvalSpec
    when the caller has read it already. `load_model`: gives the target's loaded model
    for local generation (called only when generation is needed), so a job that evaluates
    next loads it once; without it local generation loads its own. `asking`: called when
    a server is about to be asked for completions (not when the cache holds them), so a
    job can load its target while the server answers.

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
    waits = Waits(job.ground_truth.limits, started=began)
    if job.ground_truth.kind == "file":
        return from_file(job, emit)
    if job.ground_truth.kind in SERVER_KINDS:
        return from_server(job, engine or job.engine, waits, emit, asking)
    return from_local(job, engine or job.engine, waits, emit, load_model)


def from_file(job: JobSpec, emit: Emit) -> tuple[str, dict]:
    """Kind ``file``: the job's selection of a ground-truth file on this host, each record
    checked, written to the job's own folder (it belongs to this job, not to the cache)."""
    gt = job.ground_truth
    require_source(job)
    records = select(read_ground_truth_file(gt.path), job.samples, job.seed)
    out = Path(os.path.expanduser(job.workdir)) / "jobs" / (job.job_id or "adhoc")
    out = out / "ground_truth.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, jsonl(records))
    info = job_info(job)
    info.update(
        cached=False,
        samples=len(records),
        file=str(out),
        source={"kind": "file", "path": gt.path, "made": time.time()},
    )
    emit("ground_truth", done=len(records), total=len(records), cached=False)
    return str(out), info


def from_server(
    job: JobSpec,
    engine: EvalSpec,
    waits: Waits,
    emit: Emit,
    asking: Callable[[], None] | None = None,
) -> tuple[str, dict]:
    """Kinds ``sglang``, ``openai``, ``openai-text``: the server is reached and asked what
    it serves (who answers is part of what the ground truth is: another URL or served
    model is another cache entry), then, unless the cache holds the entry, asked for each
    prompt's completion, up to ``concurrency`` requests in flight (`asking` called
    first)."""
    gt = job.ground_truth
    prompts = Prompts.of(job, engine)
    require_source(job)
    problem = reachable(gt.url, min(waits.limits.timeout, 10.0))
    if problem:
        raise UserError(problem)
    source = {
        "kind": gt.kind,
        "url": endpoint(gt.url, gt.kind),
        **served_model(gt.kind, gt.url, gt.model, waits),
    }
    where = f"server {source['url']}" + (f" ({source['model']})" if source["model"] else "")
    hit = prompts.open_entry(source, where).cached(emit)
    if hit is not None:
        return hit
    if asking is not None:
        asking()
    if gt.kind == "openai-text":
        prompts.warn(
            f"ground truth from a TEXT-only server ({gt.url}): completions are "
            "retokenised with the target's tokenizer, which does not always give the "
            "ids the server generated; see the retokenisation mismatch rate",
            emit,
        )
    sampling, model = prompts.sampling, source.get("model")

    def ask(text: str, ids: list[int]) -> Any:
        # Only the request runs in the pool: tokenising, checking and emitting stay on the
        # phase's thread, in prompt order.
        if gt.kind == "sglang":
            return sglang_generate(gt.url, ids, sampling, waits)
        if gt.kind == "openai":
            return openai_completion_ids(gt.url, model, ids, sampling, waits)
        return openai_completion_text(gt.url, model, text, sampling, waits, len(ids))

    return prompts.store(
        collect(prompts, in_order(ask, prompts.rendered, gt.concurrency), waits, emit)
    )


def from_local(
    job: JobSpec,
    engine: EvalSpec,
    waits: Waits,
    emit: Emit,
    load_model: Callable[[], Any] | None = None,
) -> tuple[str, dict]:
    """Kind ``local``: the target on this host completes the prompts greedily, unless the
    cache holds them; ``concurrency`` prompts per ``generate`` call, as a server batches
    them. `load_model`: the job's loaded target (else the generator loads its own)."""
    prompts = Prompts.of(job, engine)
    source = {"kind": "local", "url": None, "model": prompts.identity["path"]}
    hit = prompts.open_entry(source, f"local generation with {engine.target}").cached(emit)
    if hit is not None:
        return hit
    generator = LocalGenerator(
        engine.target, engine.dtype, engine.threads, model=load_model() if load_model else None
    )
    answers = generator.in_order(prompts.ids, prompts.sampling, job.ground_truth.concurrency, waits)
    return prompts.store(collect(prompts, answers, waits, emit))
