"""One checkpoint evaluated as ONE Slurm job array through a login node (docs/slurm.md)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import posixpath
import tarfile
import time
from dataclasses import dataclass

from orchestrator.errors import DflashError
from orchestrator.eval import jobwire, pull
from orchestrator.eval.job import JobError
from orchestrator.eval.prompt_sets import prompts_data
from orchestrator.eval.shards.job import ShardRun, gt_lines, read_jsonl
from orchestrator.eval.shards.plan import plan_shards
from orchestrator.eval.shards.slurm_progress import EventTail, TaskReporter
from orchestrator.eval.shards.truth import read_ground_truth
from orchestrator.eval.shards.write import write_merged
from orchestrator.eval.spec import EvalOptions, build_spec, ground_truth_source
from orchestrator.inventory import HostSpec
from orchestrator.slurm import states
from orchestrator.slurm.array import ArrayRun, ArrayStatus
from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.plan import ArrayPlan
from orchestrator.slurm.role import SlurmRole
from orchestrator.slurm.status import Attempt
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, last_line, open_host, quote
from remote.protocol import GT_DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS
from remote.protocol import GT_SOURCES, JOB_CARRY_KEY, SpecError, check_slurm_end

# Each array's bound, queue waits included.
RUN_TIMEOUT = 86400.0
# Stopping the controller, not a task's scancel, stops the eval.
RETRY = states.RETRYABLE | {"CANCELLED"}
PUSH_TIMEOUT = 600.0


@dataclass
class Cluster:
    """The login node of one run and where the run's files are on the shared folder."""

    host: Host
    spec: HostSpec
    role: SlurmRole

    @functools.cached_property
    def client(self) -> SlurmClient:
        """One client for the run: what it learnt of sacct holds for both arrays."""
        return SlurmClient(self.host)

    @property
    def work(self) -> str:
        """Every task's workdir (jobs, ground-truth cache, prompts)."""
        return posixpath.join(self.role.shared, "work")

    @property
    def bundle(self) -> str:
        return posixpath.join(self.role.shared, "bundles", bundle.bundle_name())

    def command(self, prefix: str, folder: str) -> tuple[str, ...]:
        """What each array task runs: ``job array`` of the shared bundle."""
        return (
            self.spec.python,
            self.bundle,
            "job",
            "array",
            f"--workdir={self.work}",
            f"--job-id={prefix}",
            f"--dir={posixpath.join(folder, 'specs')}",
        )


def _push_if_missing(host: Host, path: str, data: bytes) -> None:
    """`data` to `path` on the shared folder unless it is there already (content-addressed)."""
    if not host.has_file(path, hashlib.sha256(data).hexdigest()):
        host.put_bytes(data, path)


def _push_tree(host: Host, folder: str, files: dict[str, bytes]) -> None:
    """`files` (relative names) into `folder`, in one command: a tar stream unpacked there."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    line = f"tar -x --no-same-owner -f - -C {quote(folder)}"
    done = host.run(line, check=False, timeout=PUSH_TIMEOUT, stdin=buf.getvalue())
    if not done.ok:
        raise DflashError(
            f"{host.name}: could not write the tasks' inputs in {folder}: "
            f"{last_line(done.stderr) or f'exit {done.exit_code}'}"
        )


def _shared_prompts(cluster: Cluster, options: EvalOptions) -> tuple[EvalOptions, dict | None]:
    """`options` with local prompts pushed to the shared folder as ``host:``, and the spec's
    ``prompts`` entry (None where nothing needs pushing)."""
    role = cluster.spec.eval
    prompts = options.prompts or (None if role and role.prompts else "chat")
    gt_kind = ground_truth_source(cluster.host, cluster.spec, options)["kind"]
    if prompts is None or prompts.startswith("host:") or not GT_SOURCES[gt_kind].reads_prompts:
        return options, None
    given = prompts_data(prompts)
    path = posixpath.join(cluster.work, "prompts", given.carried_name)
    _push_if_missing(cluster.host, path, given.data)
    return dataclasses.replace(options, prompts="host:" + path), given.entry(path)


def _job_spec(cluster: Cluster, run: ShardRun, options: EvalOptions, **kw) -> dict:
    """An eval job spec for a task, in the tasks' workdir."""
    job = build_spec(cluster.host, cluster.spec, run.checkpoint, options, **kw)
    job.pop(JOB_CARRY_KEY, None)
    job["workdir"] = cluster.work
    return job


def _array(
    cluster: Cluster,
    run: ShardRun,
    name: str,
    inputs: dict[str, bytes],
    tasks: int,
    timeout: float,
) -> ArrayStatus:
    """Put `inputs` in ``<shared>/<name>``, submit `tasks` tasks as one array and watch it to
    its end, told through `TaskReporter`."""
    folder = posixpath.join(cluster.role.shared, name)
    plan = ArrayPlan(cluster.role, name, tasks, cluster.command(name, folder))
    array = ArrayRun(cluster.client, plan, retry=RETRY)
    cluster.client.make_folder(plan)
    _push_tree(cluster.host, plan.folder, inputs)

    def label(task: int | None) -> str:
        return cluster.spec.name if task is None else _label(cluster, name, task)

    def failed(task: int, attempt: Attempt, ran: bool) -> None:
        if ran and attempt.state != states.LOST:
            _record_end(cluster, run, label(task), f"{name}-{task}-{attempt.job_id}", attempt)

    tail = EventTail(cluster.host, cluster.work)
    attempts = cluster.role.max_retries + 1
    array.submit_all()
    return array.wait(timeout, TaskReporter(run.emit, tail, name, label, attempts, failed))


def _record_end(cluster: Cluster, run: ShardRun, label: str, job_id: str, attempt: Attempt):
    """Record how the scheduler ended `attempt` in its job folder (a node failure is not the
    cancellation its SIGTERM looked like); failing is a warning."""
    end = {"job": attempt.ref, "state": attempt.state, "nodes": attempt.nodes}
    end.update(why=attempt.why, exit_code=attempt.exit_code)
    argv = ["job", "array-end", f"--workdir={cluster.work}", f"--job-id={job_id}"]
    try:
        jobwire.call(cluster.host, "status", job_id, argv=argv, payload=check_slurm_end(end))
    except (DflashError, SpecError) as exc:
        message = f"could not record how {attempt.ref} ended in its job folder: {exc}"
        run.emit(label, {"event": "warning", "message": message})


def _label(cluster: Cluster, name: str, task: int) -> str:
    return f"{cluster.spec.name}#{'gt' if name.endswith('-gt') else task}"


def _job_call(cluster: Cluster, action: str, job_id: str) -> dict:
    """``job <action>`` of task job `job_id`, run on the login node; the answer checked."""
    argv = ["job", action, f"--workdir={cluster.work}", f"--job-id={job_id}"]
    return jobwire.call(cluster.host, action, job_id, argv=argv)[1]


def _task_job_id(name: str, status: ArrayStatus, task: int) -> str:
    """The job id `remote.jobs.array` gave the task's last attempt."""
    return jobwire.local_job_id(f"{name}-{task}-{status.tasks[task].last.job_id}")


def _failed(cluster: Cluster, name: str, status: ArrayStatus) -> JobError:
    """One line for failed tasks: the scheduler's word, and the first job's own error."""
    line = status.failure_line()
    for task in status.failed:
        try:
            job_id = _task_job_id(name, status, task)
            state = _job_call(cluster, "status", job_id)
        except DflashError:
            continue
        error = (state.get("exit") or {}).get("error")
        if error:
            return JobError(f"{line}; task {task}'s job said: {error}")
    return JobError(line)


def _pull(cluster: Cluster, run: ShardRun, name: str, status: ArrayStatus, task: int):
    """The task's result pulled into ``run.stage/shards/``."""
    job_id = _task_job_id(name, status, task)
    answer = _job_call(cluster, "pull", job_id)
    return job_id, pull.pull_results(cluster.host, job_id, run.stage / "shards", answer)


def _ground_truth(cluster: Cluster, run: ShardRun, options: EvalOptions, timeout: float):
    """The ground truth, made once by a one-task array: (records, its info, the job spec)."""
    options, prompts = _shared_prompts(cluster, options)
    job = _job_spec(cluster, run, dataclasses.replace(options, stop_after="ground_truth"))
    if prompts is not None:
        job["prompts"] = prompts
    name = array_names(run.run_id)[0]
    status = _array(cluster, run, name, {"specs/0.json": json.dumps(job).encode()}, 1, timeout)
    if status.failed:
        raise _failed(cluster, name, status)
    job_id = _task_job_id(name, status, 0)
    answer = _job_call(cluster, "pull", job_id)
    if answer.get("state") != "done":  # Slurm's COMPLETED is the task's exit code, not its end
        raise JobError(f"{cluster.spec.name}: ground truth job {job_id} {answer.get('state')}")
    files = pull.decode_files(cluster.host, job_id, answer.get("files"), ("ground_truth.json",))
    run.emit(_label(cluster, name, 0), {"event": "ground_truth_job", "job_id": job_id})
    raw = files["ground_truth.json"]
    records, info = read_ground_truth(cluster.host, cluster.spec.name, job_id, raw)
    return records, info, job


def _task_inputs(cluster: Cluster, run: ShardRun, gt: list[dict], plan: list) -> dict:
    """Each task's job spec and ground-truth slice by name, each told as a ``shard`` event."""
    inputs: dict[str, bytes] = {}
    for task, shard in enumerate(plan):
        path = posixpath.join(cluster.role.shared, run.run_id, "gt", f"{task}.jsonl")
        job = _job_spec(cluster, run, run.options, exact_file=path)
        job["shard"] = {"run_id": run.run_id, "indices": shard.indices, "task": task}
        inputs[f"gt/{task}.jsonl"] = gt_lines(gt, shard.indices)
        inputs[f"specs/{task}.json"] = json.dumps(job).encode()
        tokens = sum(len(gt[i]["prompt_ids"]) + len(gt[i]["completion_ids"]) for i in shard.indices)
        event = {"event": "shard", "job_id": None, "samples": len(shard.indices), "tokens": tokens}
        run.emit(shard.host, event)
    return inputs


def _collect(cluster: Cluster, run: ShardRun, gt: list[dict], plan: list, status: ArrayStatus):
    """Every task's pulled result: (records by ground-truth index, results, jobs)."""
    records: dict[int, dict] = {}
    results, jobs = [], []
    for task, shard in enumerate(plan):
        job_id, run_dir = _pull(cluster, run, run.run_id, status, task)
        pulled = read_jsonl((run_dir / "samples.jsonl").read_bytes())
        if [r.get("id") for r in pulled] != [gt[i]["id"] for i in shard.indices]:
            raise JobError(
                f"{cluster.spec.name}: task {task} ({job_id}) returned samples other than "
                "its shard's"
            )
        records.update(zip(shard.indices, pulled, strict=True))
        result = json.loads((run_dir / "result.json").read_text())
        results.append(result)
        jobs.append(
            {
                "host": shard.host,
                "job_id": job_id,
                "state": "done",
                "error": None,
                "samples": len(shard.indices),
                "records_received": len(pulled),
                "environment": result.get("environment"),
                "run_dir": str(run_dir.relative_to(run.stage)),
                "attempts": status.tasks[task].to_json()["attempts"],
            }
        )
    return records, results, jobs


def array_names(run_id: str) -> tuple[str, str]:
    """A run's two arrays' names (ground truth, shards), also their folders."""
    return f"{run_id}-gt", run_id


def cancel_run(spec: HostSpec, inventory, run_id: str) -> None:
    """``scancel`` what a dead controller left of run `run_id`'s arrays on the cluster."""
    with open_host(spec, inventory) as host:
        SlurmClient(host).cancel_named(array_names(run_id))


def run_slurm_eval(run: ShardRun, *, timeout: float = RUN_TIMEOUT) -> None:
    """The whole run on `run`'s login node, merged into ``run.stage``; a task failed after
    its retries is one line, nothing left queued."""
    t0 = time.time()
    [spec] = run.specs
    if spec.slurm is None:
        raise DflashError(f"host {spec.name} has no slurm role in the inventory")
    with open_host(spec, run.inventory) as host:
        cluster = Cluster(host, spec, spec.slurm)
        run.hosts[spec.name] = host
        _push_if_missing(host, cluster.bundle, bundle.build()[1])
        gt, gt_info, gt_job = _ground_truth(cluster, run, run.options, timeout)
        sampling = gt_job.get("sampling") or {}
        max_new = int(sampling.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        labels = [_label(cluster, run.run_id, i) for i in range(spec.slurm.shards)]
        plan = [s for s in plan_shards(gt, labels, max_new) if s.indices]
        for task, shard in enumerate(plan):  # task ids are the non-empty shards'
            shard.host = _label(cluster, run.run_id, task)
        run.emit(
            spec.name,
            {"event": "plan", "samples": len(gt), "shards": [s.to_json(gt) for s in plan]},
        )
        inputs = _task_inputs(cluster, run, gt, plan)
        status = _array(cluster, run, run.run_id, inputs, len(plan), timeout)
        if status.failed:
            raise _failed(cluster, run.run_id, status)
        records, results, jobs = _collect(cluster, run, gt, plan, status)
    shards = {
        "hosts": [spec.name],
        "balance_by": "expected tokens: prompt + completion (ground truth known)",
        "plan": [s.to_json(gt) for s in plan],
        "jobs": jobs,
        "reassigned": [],
        "slurm": status.to_json(),
        "ground_truth": {
            "obtained_on": f"{spec.name} (a one-task Slurm array)",
            "job_id": gt_info.get("job_id"),
            "sha256": gt_info.get("sha256"),
            "samples": len(gt),
            "shared_as": "made once by a Slurm task; each array task evaluates its slice "
            "of that file (kind 'file'), so all tasks share one ground truth",
        },
    }
    write_merged(
        run,
        results=results,
        ordered=[records[i] for i in range(len(gt))],
        shards=shards,
        gt_info=gt_info,
        gt_job=gt_job,
        hosts=[spec.name],
        t0=t0,
        gt_workdir=cluster.work,
    )
