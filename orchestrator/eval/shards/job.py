"""One shard's job on one host; a host's failure is recorded in its `Outcome`, never raised."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.eval import job as remote_job
from orchestrator.eval import jobwire, pull
from orchestrator.eval.job import JobError, JobRef
from orchestrator.eval.spec import EvalOptions, build_spec
from orchestrator.eval.uploads import carry_or_push
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport.hosts import Host
from remote.protocol import GT_DEFERRED_FILE, JobState, sample_labels
from remote.protocol.sampling import completion_keys

HostEventHandler = Callable[[str, dict], None]


@dataclass
class ShardRun:
    """State a sharded run's phases share; workers only fill their `Outcome` and emit."""

    inventory: Inventory
    specs: list[HostSpec]
    checkpoint: str
    options: EvalOptions
    on_event: HostEventHandler | None
    stage: Path
    run_id: str
    hosts: dict[str, Host] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    _event_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def emit(self, host: str, event: dict) -> None:
        if self.on_event:
            with self._event_lock:  # one progress view fed by several watcher threads
                self.on_event(host, event)

    def job_id(self, spec: HostSpec) -> str:
        self.attempts[spec.name] = self.attempts.get(spec.name, 0) + 1
        return f"{self.run_id}-{spec.name}-{self.attempts[spec.name]}"


@dataclass
class Outcome:
    """What one shard job gave back: records received, and its result or why it failed."""

    host: str
    indices: list[int]
    job_id: str | None = None
    records: dict[int, dict] = field(default_factory=dict)
    result: dict | None = None
    run_dir: Path | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def gt_lines(records: list[dict], indices: list[int]) -> bytes:
    return b"".join(
        json.dumps(
            {
                "id": records[i]["id"],
                **sample_labels(records[i]),
                **completion_keys(records[i]),  # a sampled completion's prompt and index
                "prompt_ids": records[i]["prompt_ids"],
                "completion_ids": records[i]["completion_ids"],
            }
        ).encode()
        + b"\n"
        for i in indices
    )


def read_jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def start_early(run: ShardRun, spec: HostSpec) -> JobRef:
    """Start a shard's job on a deferred ground truth, so its start-up overlaps the ground
    truth's making; `run_shard` pushes its slice later."""
    host = run.hosts[spec.name]
    job = build_spec(host, spec, run.checkpoint, run.options, exact_file="(deferred)")
    job["ground_truth"] = {
        **{k: v for k, v in job["ground_truth"].items() if k != "path"},
        "deferred": jobwire.EARLY_WAIT_SECONDS,
    }
    job["shard"] = {"run_id": run.run_id, "indices": None, "started_early": True}
    return remote_job.start_job(host, job, run.job_id(spec), preflight=True, follow=True)


def run_shard(
    run: ShardRun,
    spec: HostSpec,
    indices: list[int],
    gt: list[dict],
    out: Outcome,
    early: Future | None = None,
) -> Outcome:
    """Push the slice (into `early`'s job, else a fresh one), watch, pull; never raises, a
    failure is recorded in `out`."""
    host = run.hosts[spec.name]
    try:
        data = gt_lines(gt, indices)
        ref = None
        if early is not None:
            try:
                ref = early.result()
            except Exception:  # a fresh start below says what is wrong, in one line
                ref = None
        if ref is not None:
            host.put_bytes(data, f"{ref.dir}/{GT_DEFERRED_FILE}")
        else:
            ref = _start_with(run, host, spec, indices, data)
        out.job_id = ref.job_id
        run.emit(
            spec.name,
            {
                "event": "shard",
                "job_id": ref.job_id,
                "samples": len(indices),
                "tokens": sum(
                    len(gt[i]["prompt_ids"]) + len(gt[i]["completion_ids"]) for i in indices
                ),
            },
        )

        def on_event(ev: dict) -> None:
            at = ev.get("index")  # a count, checked by `watch`; a host's, so in range?
            if ev.get("event") == "sample" and ev.get("record") and at in range(len(indices)):
                i = indices[at]
                if ev["record"].get("id") == gt[i]["id"]:
                    out.records[i] = ev["record"]
            run.emit(spec.name, ev)

        end = remote_job.watch(host, ref.job_id, on_event, stream=ref.stream)
        if end["state"] != JobState.DONE and early is not None and not out.records:
            # the early job ended before evaluating anything: start it the ordinary way
            ref = _start_with(run, host, spec, indices, data)
            out.job_id = ref.job_id
            end = remote_job.watch(host, ref.job_id, on_event, stream=ref.stream)
        if end["state"] != JobState.DONE:
            raise remote_job.failure("job", ref.job_id, host.name, end)
        run_dir = pull.pull_results(host, ref.job_id, run.stage / "shards", end)
        pulled = read_jsonl((run_dir / "samples.jsonl").read_bytes())
        if [r.get("id") for r in pulled] != [gt[i]["id"] for i in indices]:
            raise JobError(f"job {ref.job_id} returned samples other than its shard's")
        out.records = dict(
            zip(indices, pulled, strict=False)
        )  # the host's own file is authoritative
        out.result = json.loads((run_dir / "result.json").read_text())
        out.run_dir = run_dir
    except Exception as exc:  # any failure of one host is that shard's, not the run's
        out.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if out.job_id:
            try:  # a watcher that lost its connection leaves the job running: stop it
                remote_job.cancel(host, out.job_id)
            except Exception:
                pass
        run.emit(
            spec.name,
            {
                "event": "shard_failed",
                "job_id": out.job_id,
                "error": out.error,
                "kept": len(out.records),
                "unfinished": len(indices) - len(out.records),
            },
        )
    return out


def _start_with(
    run: ShardRun, host: Host, spec: HostSpec, indices: list[int], data: bytes
) -> JobRef:
    """Start a shard's job with its slice `data` as its ground truth file."""
    path = f"{host.workdir}/groundtruth/shards/{hashlib.sha256(data).hexdigest()[:16]}.jsonl"
    carry: list = []  # a small slice travels inside the job start: no round trip
    carry_or_push(host, data, path, carry)
    job = build_spec(host, spec, run.checkpoint, run.options, exact_file=path, carry=carry)
    job["shard"] = {"run_id": run.run_id, "indices": indices}
    return remote_job.start_job(host, job, run.job_id(spec), preflight=True, follow=True)


def cancel_early(run: ShardRun, early: dict[str, Future]) -> None:
    """Stop the early jobs no shard took (a host the plan left idle, a failed run)."""
    for name, fut in early.items():
        try:
            ref = fut.result()
        except Exception:
            continue
        try:
            if ref.stream is not None:
                ref.stream.kill()
            remote_job.cancel(run.hosts[name], ref.job_id)
        except Exception:  # best effort: it ends by itself when its wait runs out
            pass
