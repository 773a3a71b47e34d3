"""An ``eval`` job as the runner runs it: checks, ground truth, engine, in one process."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from remote.atomic import write_json_atomic
from remote.entry import self_command
from remote.errors import UserError
from remote.protocol import GT_DEFERRED_FILE, EvalSpec, Sampling, SpecError
from remote.protocol.job_spec import engine_sampling


class Events(Protocol):
    """A job's event log (`remote.jobs.folder.EventLog`)."""

    def emit(self, event: str, **fields: Any) -> None: ...

    def write(self, obj: dict) -> None: ...


def job_engine(spec: dict) -> EvalSpec:
    """The job's validated engine `EvalSpec` at its sampling's temperature, top-k, top-p
    and seed (`engine_sampling`); a bad one fails the job in one line."""
    try:
        return engine_sampling(EvalSpec.of_job(spec), Sampling.from_json(spec.get("sampling")))
    except (SpecError, TypeError) as exc:
        raise UserError(f"job spec: {exc}") from None


def run_job(path: Path, spec: dict, events: Events, *, preflight: bool = False) -> int:
    """The eval job in `path`: with `preflight` the host checks first, then the eval."""
    engine = job_engine(spec)
    checked: dict = {}
    if preflight:
        run_preflight(path, spec, engine, checked, events)
    return run_eval_job(path, spec, events, engine, checked.get("plan"))


def run_preflight(
    path: Path, spec: dict, engine: EvalSpec, keep: dict, events: Events | None = None
) -> dict:
    """The host checks into ``preflight.json``, warnings as events, nothing loaded."""
    from remote.eval import preflight

    try:
        report = preflight.check(spec, engine, keep)
    except UserError as exc:
        write_json_atomic(path / "preflight.json", {"ok": False, "error": str(exc)})
        raise
    write_json_atomic(path / "preflight.json", report)
    for line in report.get("warnings", []) if events is not None else []:
        events.emit("warning", message=line)
    return report


def run_eval_job(
    path: Path,
    spec: dict,
    events: Events,
    engine: EvalSpec | None = None,
    plan: tuple | None = None,
    after_ground_truth: Callable[[str], str | None] | None = None,
) -> int:
    """Ground truth then engine, target loaded once (docs/dflash-eval.md, phases);
    `after_ground_truth` may name another file of completions for the engine."""
    from remote.eval import engine as evaluate
    from remote.eval import groundtruth
    from remote.eval.preflight import read_job

    engine = with_threads(engine or job_engine(spec), events)
    loaded: list = []

    def load_model():
        if not loaded:
            import torch

            from remote.eval import target as target_mod

            dtype = getattr(torch, engine.dtype)
            loaded.append(target_mod.load_target(engine.target, dtype, plan))
        return loaded[0].model

    job = read_job(spec)
    gt = job.ground_truth
    loading: list[Callable[[], None]] = []

    def asking() -> None:
        # the target loads while a server or another host makes the ground truth, not after it
        if job.stop_after != "ground_truth" and not loading:
            loading.append(_in_background(load_model))

    if gt.awaits_file():
        events.emit("phase", phase="await_ground_truth")
        arrived = await_file(
            path / GT_DEFERRED_FILE, gt.deferred, meanwhile=asking, after=PRELOAD_AFTER_SECONDS
        )
        gt = replace(gt, path=str(arrived))
        job = replace(job, ground_truth=gt)

    def prepare(job):
        return groundtruth.prepare(
            job, emit=events.emit, engine=engine, load_model=load_model, asking=asking
        )

    ladder = None
    if job.context_ladder:
        from remote.eval.groundtruth import ladder as ladders

        events.emit("phase", phase="ladder", rungs=list(job.context_ladder))
        job, ladder = ladders.build(job, path, prepare, events.emit)
    events.emit("phase", phase="ground_truth", source=gt.kind)
    gt_path, gt_info = prepare(job)
    if ladder is not None:
        gt_info["ladder"] = ladder
    write_json_atomic(path / "ground_truth.json", gt_info)
    if job.stop_after == "ground_truth":
        return 0
    if after_ground_truth is not None:
        gt_path = after_ground_truth(gt_path) or gt_path
    for wait in loading:
        wait()
    engine = build_eval_spec(path, engine, gt_path)
    write_json_atomic(path / "eval_spec.json", engine.to_json())
    events.emit("phase", phase="eval")
    from remote.eval.feature_cache import FeatureCache

    evaluate.run_eval(
        engine,
        on_event=lambda ev: events.write({**ev, "time": round(time.time(), 3)}),
        target=loaded[0] if loaded else None,
        features=FeatureCache.for_job(job.workdir, job.feature_cache_bytes()),
    )
    # A ground truth the target disagrees with wholesale is flagged and leaves the cache.
    gt_info = groundtruth.judge_job(gt_info, path, emit=events.emit)
    write_json_atomic(path / "ground_truth.json", gt_info)
    annotate_result(path / "result.json", gt_info, spec, engine)
    return 0


def with_threads(engine: EvalSpec, events: Events) -> EvalSpec:
    """`engine` with its CPU threads: its own, else the host's choice (a ``note`` event)."""
    from remote.eval.device import auto_threads

    if engine.threads:
        return engine
    threads, why = auto_threads(engine.target, engine.device)
    if threads is None:
        return engine
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    events.emit("note", message=why)
    return replace(engine, threads=threads)


def _in_background(work: Callable[[], Any]) -> Callable[[], Any]:
    """Start `work` in a daemon thread; the returned function waits for its value or exception."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="load-target", daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return wait


AWAIT_POLL_SECONDS = 0.02


# sooner than this, a deferred ground truth was cached where it was made
PRELOAD_AFTER_SECONDS = 10.0


def await_file(
    file: Path,
    limit: float,
    meanwhile: Callable[[], None] | None = None,
    after: float = 0.0,
) -> Path:
    """`file` once it exists; one line after `limit` s; `meanwhile` after `after` s."""
    began = time.monotonic()
    deadline = began + limit
    while not file.is_file():
        if meanwhile is not None and time.monotonic() - began >= after:
            meanwhile()
            meanwhile = None
        if time.monotonic() > deadline:
            raise UserError(
                f"the ground truth for this job did not arrive in {limit:g}s "
                f"({file.name} in {file.parent}); was its controller stopped?"
            )
        time.sleep(AWAIT_POLL_SECONDS)
    return file


def build_eval_spec(path: Path, engine: EvalSpec, gt_path: str) -> EvalSpec:
    """The engine's spec: the job's, with this host's ground-truth file and output folder."""
    return replace(engine, ground_truth=gt_path, output_dir=str(path))


def annotate_result(result_path: Path, gt_info: dict, spec: dict, engine: EvalSpec) -> None:
    """Make sure the result names its ground-truth source and the job that produced it."""
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(result, dict):
        return
    inputs = result.setdefault("inputs", {})
    inputs.setdefault("ground_truth_source", gt_info)
    inputs.setdefault(
        "eval_engine",
        {
            "name": "dflash offline walk (remote.eval.engine)",
            "bundle": Path(self_command()[-1]).name,
        },
    )
    inputs.setdefault("checkpoint", spec.get("checkpoint"))
    inputs.setdefault("prompts", spec.get("prompts"))
    _record_identities(inputs, gt_info, engine)
    result.setdefault(
        "job",
        {
            "job_id": result_path.parent.name,
            "host": spec.get("host"),
            "created": spec.get("created"),
        },
    )
    write_json_atomic(result_path, result)


def _record_identities(inputs: dict, gt_info: dict, engine: EvalSpec) -> None:
    """What comparisons and trackers know the run by: drafter, ground truth, target."""
    from remote.eval import groundtruth, provenance

    if engine.drafter and "drafter_identity" not in inputs:
        try:
            inputs["drafter_identity"] = provenance.drafter_identity(engine.drafter)
        except OSError as exc:
            inputs["drafter_identity"] = {"sha256": None, "error": str(exc)}
    if gt_info.get("file") and "ground_truth_sha256" not in inputs:
        try:
            inputs["ground_truth_sha256"] = provenance.file_sha256(gt_info["file"])
        except OSError:
            inputs["ground_truth_sha256"] = None
    if engine.target and "target_identity" not in inputs:
        try:
            inputs["target_identity"] = groundtruth.target_identity(engine.target)
        except UserError:
            inputs["target_identity"] = None
