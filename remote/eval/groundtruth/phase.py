"""The ground-truth phase of a job (`prepare`): read the job once
(`remote.eval.preflight.read_job`), then its kind's source makes the ground truth: a
host's file (`FileSource`), the target itself (`LocalSource`) or a server (`servers`).
Each kind of the contract (`remote.protocol.GT_SOURCES`) has one source here (`SOURCES`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote.atomic import write_atomic
from remote.eval.groundtruth.cache import Emit, jsonl
from remote.eval.groundtruth.checks import read_ground_truth_file
from remote.eval.groundtruth.completions import Prompts, collect, job_info, require_source
from remote.eval.groundtruth.local import LocalGenerator
from remote.eval.groundtruth.prompts import select
from remote.eval.groundtruth.servers import SERVERS
from remote.eval.preflight import read_job
from remote.httpclient import Waits
from remote.protocol import EvalSpec, GTKind, JobSpec


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
    retokenisation). Every completion is checked before anything is written;
    ``ground_truth.fresh``: the cache entry is dropped and made again. Every wait is
    bounded (`remote.protocol.GTLimits`, from this call on)."""
    began = time.monotonic()
    job = read_job(spec)
    waits = Waits(job.ground_truth.limits, started=began)
    source = SOURCES[job.ground_truth.kind]
    return source.make(job, engine or job.engine, waits, emit, load_model=load_model, asking=asking)


class FileSource:
    """A ground-truth file on this host: the job's selection of it, each record checked,
    written to the job's own folder (it belongs to this job, not to the cache)."""

    kind = GTKind.FILE

    def make(self, job: JobSpec, engine: EvalSpec, waits: Waits, emit: Emit, **_) -> tuple:
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
            source={"kind": gt.kind, "path": gt.path, "made": time.time()},
        )
        emit("ground_truth", done=len(records), total=len(records), cached=False)
        return str(out), info


class LocalSource:
    """The target on this host completes the prompts (greedily, or sampled with each
    completion's seed), unless the cache holds them; ``concurrency`` prompts per
    ``generate`` call, as a server batches them. Its cache identity is the target
    itself. `load_model`: the job's loaded target (else the generator loads its own)."""

    kind = GTKind.LOCAL

    def make(
        self,
        job: JobSpec,
        engine: EvalSpec,
        waits: Waits,
        emit: Emit,
        *,
        load_model: Callable[[], Any] | None = None,
        **_,
    ) -> tuple[str, dict]:
        prompts = Prompts.of(job, engine)
        source = {"kind": self.kind.name, "url": None, "model": prompts.identity["path"]}
        hit = prompts.open_entry(source, f"local generation with {engine.target}").cached(emit)
        if hit is not None:
            return hit
        generator = LocalGenerator(
            engine.target, engine.dtype, engine.threads, model=load_model() if load_model else None
        )
        concurrency = job.ground_truth.concurrency
        answers = generator.in_order(prompts.ids, prompts.requests(), concurrency, waits)
        return prompts.store(collect(prompts, answers, waits, emit))


# How this host makes each kind of ground truth the contract names, by name.
SOURCES = {s.kind.name: s for s in (FileSource(), LocalSource(), *SERVERS)}
