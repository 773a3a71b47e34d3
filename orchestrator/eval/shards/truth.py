"""A sharded eval's ground truth, made once: a ground-truth-only job on the first host,
its file fetched here and checked as a host checks one (`fetch_ground_truth`), and the
merged eval's verdict on it (`judge_ground_truth`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import job as remote_job
from orchestrator.eval import jobwire, pull
from orchestrator.eval.job import JobError, JobRef
from orchestrator.eval.outline import outline_event
from orchestrator.eval.shards.job import ShardRun
from orchestrator.eval.spec import build_spec
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import GT_CACHE_KEY_RE, JobState, agreement_suspect, flag_suspect

# Dropping a ground truth judged wrong from the first host's cache: one rm, or given up.
EVICT_SECONDS = 60.0


def _carried(host: Host, job_id: str, end: dict, name: str) -> bytes | None:
    """The result file `name` a watch's end carried (``--pull``), checked as every pulled
    file is (`pull.decode_files`); None when it carried none (then fetch it)."""
    files = end.get("files")
    if not isinstance(files, dict) or name not in files:
        return None
    return pull.decode_files(host, job_id, files, required=(name,))[name]


def _ground_truth_records(host: str, data: bytes) -> list[dict]:
    """The records of the ground truth file a host made, checked as a host checks a
    ground truth file it is given (`remote.eval.groundtruth.read_ground_truth_file`)."""
    from remote.errors import UserError
    from remote.eval.groundtruth import read_ground_truth_file

    with tempfile.TemporaryDirectory(prefix="dflash-gt-") as tmp:
        path = Path(tmp) / "ground_truth.jsonl"
        path.write_bytes(data)
        try:
            return read_ground_truth_file(str(path))
        except UserError as exc:
            raise JobError(
                f"{host}: its ground truth: {str(exc).replace(str(path), 'file')}"
            ) from None


def start_ground_truth(run: ShardRun) -> tuple[JobRef, dict]:
    """Start the ground-truth job on the first host; returns once its host checks passed
    (the target's tokenizer among them), so a run whose ground truth cannot be made
    starts nothing else. (ref, the job spec)."""
    spec = run.specs[0]
    host = run.hosts[spec.name]
    options = dataclasses.replace(run.options, stop_after="ground_truth")
    job = build_spec(host, spec, run.checkpoint, options)
    ref = remote_job.start_job(host, job, f"{run.run_id}-gt", preflight=True, follow=True)
    run.emit(spec.name, {"event": "ground_truth_job", "job_id": ref.job_id})
    hosts = ", ".join(s.name for s in run.specs)
    run.emit(spec.name, outline_event(job, f"sharded eval {run.run_id} across {hosts}"))
    return ref, job


def fetch_ground_truth(run: ShardRun, ref: JobRef, job: dict) -> tuple[list[dict], dict, dict]:
    """Watch the ground-truth job `ref` to its end; returns (records, the job's
    ground_truth.json, the job spec)."""
    spec = run.specs[0]
    host = run.hosts[spec.name]
    end = remote_job.watch(host, ref.job_id, lambda ev: run.emit(spec.name, ev), stream=ref.stream)
    if end["state"] != JobState.DONE:
        raise remote_job.failure("ground truth job", ref.job_id, spec.name, end)
    raw = _carried(host, ref.job_id, end, "ground_truth.json") or jobwire.fetch(
        host, f"{ref.dir}/ground_truth.json", "ground_truth.json", jobwire.ANSWER_MAX
    )
    records, info = read_ground_truth(host, spec.name, ref.job_id, raw)
    return records, info, job


def read_ground_truth(host: Host, name: str, job_id: str, raw: bytes) -> tuple[list[dict], dict]:
    """The records and ``ground_truth.json`` (`raw`, as the job `job_id` on host `name`
    wrote it) of a ground-truth job: the file it names fetched from `host` (at most
    `jobwire.GROUND_TRUTH_MAX`) and checked as a host checks one, its sha256 and the job's id
    added to the info."""
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("file"), str):
        raise JobError(f"{name}: ground truth job {job_id} names no ground truth file")
    data = jobwire.fetch(host, info["file"], "the ground truth", jobwire.GROUND_TRUTH_MAX)
    records = _ground_truth_records(name, data)
    info["sha256"] = hashlib.sha256(data).hexdigest()
    info["job_id"] = job_id
    return records, info


def judge_ground_truth(
    run: ShardRun, gt_info: dict, agreement: object, workdir: str | None = None
) -> dict:
    """The merged eval's verdict on its ground truth (`remote.protocol.
    agreement_suspect`): wrong wholesale, it is flagged (`flag_suspect`) and its entry
    dropped from the first host's cache, where the ground-truth job made it (one ``rm``
    over a new connection, by the cache key that host reported, checked to be one).
    `workdir`: the workdir that cache is in (default: the first host's own)."""
    rate = agreement.get("rate") if isinstance(agreement, dict) else None
    sampled = bool((gt_info.get("sampling") or {}).get("temperature"))
    if not agreement_suspect(rate, sampled):
        return gt_info
    key, evicted = gt_info.get("cache_key"), False
    if isinstance(key, str) and GT_CACHE_KEY_RE.match(key):
        try:
            with open_host(run.specs[0], run.inventory) as host:
                base = f"{workdir or host.workdir}/groundtruth/{key}"
                done = host.run(
                    ["rm", "-f", "--", f"{base}.jsonl", f"{base}.json"],
                    check=False,
                    timeout=EVICT_SECONDS,
                )
                evicted = done.ok
        except DflashError:  # the flag says it stayed; the next eval's user is told
            pass
    flagged = flag_suspect(gt_info, rate, evicted)
    run.emit(run.specs[0].name, {"event": "warning", "message": flagged["warnings"][-1]})
    return flagged
