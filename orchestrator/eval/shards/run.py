"""One checkpoint evaluated across several SSH eval hosts (docs/eval.md, "Several eval hosts")."""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import jobwire, pull
from orchestrator.eval.job import JobError
from orchestrator.eval.shards.job import (
    HostEventHandler,
    Outcome,
    ShardRun,
    cancel_early,
    run_shard,
    start_early,
)
from orchestrator.eval.shards.plan import plan_shards
from orchestrator.eval.shards.slurm import run_slurm_eval
from orchestrator.eval.shards.truth import fetch_ground_truth, start_ground_truth
from orchestrator.eval.shards.write import write_merged
from orchestrator.eval.spec import EvalOptions, new_job_id
from orchestrator.inventory import Inventory
from orchestrator.results.store import results_dir
from orchestrator.transport.hosts import open_host
from remote.protocol import GT_DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS
from remote.protocol import JobState


def _run(run: ShardRun) -> Path:
    """The whole SSH run: ground truth, plan, shards, merge."""
    t0 = time.time()
    names = [s.name for s in run.specs]
    by_name = {s.name: s for s in run.specs}
    early: dict[str, Future] = {}
    starter = ThreadPoolExecutor(max_workers=len(run.specs))
    with ThreadPoolExecutor(max_workers=len(run.specs)) as pool:
        for spec, host in zip(
            run.specs,
            pool.map(lambda s: open_host(s, run.inventory), run.specs),
            strict=False,
        ):
            run.hosts[spec.name] = host
        try:
            # Shard jobs start beside the ground-truth job, so their start-up overlaps it.
            gt_ref, gt_job = start_ground_truth(run)
            early = {s.name: starter.submit(start_early, run, s) for s in run.specs}
            gt, gt_info, gt_job = fetch_ground_truth(run, gt_ref, gt_job)
            sampling = gt_job.get("sampling") or {}
            max_new = int(sampling.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
            plan = plan_shards(gt, names, max_new)
            run.emit(
                names[0],
                {"event": "plan", "samples": len(gt), "shards": [s.to_json(gt) for s in plan]},
            )
            records: dict[int, dict] = {}
            outcomes: list[Outcome] = []
            reassigned: list[dict] = []
            running: dict[Future, Outcome] = {}
            idle: list[str] = []  # hosts that finished their work; failed ones never are
            entry_of: dict[int, dict] = {}  # sample index -> its reassignment entry

            def submit(host: str, indices: list[int]) -> None:
                out = Outcome(host, indices)
                fut = pool.submit(
                    run_shard, run, by_name[host], indices, gt, out, early.pop(host, None)
                )
                running[fut] = out

            for shard in plan:
                if shard.indices:
                    submit(shard.host, shard.indices)
                else:
                    idle.append(shard.host)
            # in the background: an idle host's early start may still be under way
            starter.submit(cancel_early, run, {h: early.pop(h) for h in idle if h in early})
            pending: list[int] = []
            while running:
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    out = running.pop(fut)
                    outcomes.append(out)
                    records.update(out.records)
                    if out.ok:
                        idle.append(out.host)
                        continue
                    lost = [i for i in out.indices if i not in out.records]
                    entry = {
                        "host": out.host,
                        "job_id": out.job_id,
                        "reason": out.error,
                        "kept": [gt[i]["id"] for i in out.indices if i in out.records],
                        "samples": [gt[i]["id"] for i in lost],
                        "to": {},
                    }
                    reassigned.append(entry)
                    entry_of.update((i, entry) for i in lost)
                    pending.extend(lost)
                if pending and idle:
                    for shard in plan_shards(gt, idle, max_new, pending):
                        if not shard.indices:
                            continue
                        idle.remove(shard.host)
                        for i in shard.indices:
                            entry_of[i]["to"].setdefault(shard.host, []).append(gt[i]["id"])
                        submit(shard.host, shard.indices)
                    pending = []
                if pending and not running:
                    raise JobError(
                        f"every host failed; {len(pending)} of {len(gt)} "
                        f"samples unevaluated (last error: "
                        f"{reassigned[-1]['reason']})"
                    )
        finally:
            cancel_early(run, early)
            starter.shutdown(wait=False)
            for host in run.hosts.values():
                host.close()

    ordered = [records[i] for i in range(len(gt))]
    shards = {
        "hosts": names,
        "balance_by": "expected tokens: prompt + completion (ground truth known)",
        "plan": [s.to_json(gt) for s in plan],
        "jobs": [
            {
                "host": o.host,
                "job_id": o.job_id,
                "state": JobState.DONE if o.ok else JobState.FAILED,
                "error": o.error,
                "samples": len(o.indices),
                "records_received": len(o.records),
                "environment": (o.result or {}).get("environment"),
                "run_dir": str(o.run_dir.relative_to(run.stage)) if o.run_dir else None,
            }
            for o in outcomes
        ],
        "reassigned": reassigned,
        "ground_truth": {
            "obtained_on": names[0],
            "job_id": gt_info.get("job_id"),
            "sha256": gt_info.get("sha256"),
            "samples": len(gt),
            "shared_as": "fetched once on the first host; each shard evaluates its slice "
            "of that file (kind 'file'), so all shards share one ground truth",
        },
    }
    write_merged(
        run,
        results=[o.result for o in outcomes if o.ok and o.result],
        ordered=ordered,
        shards=shards,
        gt_info=gt_info,
        gt_job=gt_job,
        hosts=names,
        t0=t0,
    )
    return run.stage


def run_sharded(
    inventory: Inventory,
    host_names: list[str],
    checkpoint: str,
    options: EvalOptions | None = None,
    *,
    on_event: HostEventHandler | None = None,
    dest: str | os.PathLike | None = None,
    run_id: str | None = None,
) -> Path:
    """Evaluate `checkpoint` across the hosts (a Slurm login node alone: one job array) into
    one run folder ``<results_dir>/<run-id>``, returned."""
    options = options or EvalOptions()
    specs = inventory.expand(host_names)
    if not specs:
        raise DflashError("--hosts names no host")
    pull.warm_plots()
    # it names a folder here and prefixes the shard jobs' ids
    run_id = jobwire.local_job_id(run_id or new_job_id(checkpoint))
    root = results_dir(inventory, dest)
    final = root / run_id
    stage = root / f".{run_id}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        run = ShardRun(inventory, specs, checkpoint, options, on_event, stage, run_id)
        if any(s.slurm for s in specs):
            if len(specs) != 1:
                raise DflashError(
                    f"--hosts: {', '.join(s.name for s in specs if s.slurm)} is a Slurm "
                    "login node: name it alone (its array tasks are the shards)"
                )
            run_slurm_eval(run)
        else:
            _run(run)
        if final.exists():
            shutil.rmtree(final)
        os.replace(stage, final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return pull.finish_local(final)
