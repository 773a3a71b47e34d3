"""Evaluate one checkpoint across several eval hosts: plan, run the shards, merge.

The everyday path is one call::

    run_sharded(inventory, ["ct129", "ct130"], "step_12000", EvalOptions(samples=200),
                on_event=lambda host, ev: print(host, ev))

1. **Ground truth, once.** A ground-truth-only job (``stop_after="ground_truth"``) runs on
   the first host, exactly as a single-host eval's first phase would (server, file, local
   generation; cached on that host). Its JSONL is pulled here. Every shard then gets ITS
   SLICE of that very file, pushed to its host as a ``file`` ground truth. Why not let every
   host ask the server for its ids: N hosts would each need the server reachable and
   their own cache, a server whose answer changed between requests would give shards
   different ground truth, and a ``local`` source would pay generation N times. One file,
   sliced, is identical across shards by construction. (`shard_truth`)
2. **Plan.** `shard_plan.plan_shards`: balanced by expected tokens, not by sample count
   (see there). Each shard keeps ground-truth order.
3. **Run.** One detached job per host (`shard_job.run_shard`), all watched at once in a
   `concurrent.futures` thread pool over our `Host` objects; events go to ``on_event(host,
   event)`` (the CLI draws one progress row per host and a total). Besides the jobs' own
   events: ``plan`` (samples, shards), ``shard`` (a job started: job_id, samples, tokens)
   and ``shard_failed`` (error, kept, unfinished). The engine's sample
   events carry each sample's record, so the records a host finished are here even if the
   host is lost afterwards.
4. **Failures.** A shard whose job fails, is lost, or whose connection drops keeps the
   records already received; its unfinished samples are re-planned across the hosts that
   are free (as soon as one is), and the result lists that under ``"reassigned"``.
5. **Merge.** (`shard_plan.merge_result`) Records in ground-truth order; aggregates recomputed by
   `remote.eval.metrics.summarize`, the function the engine itself uses, so the merged result
   equals what one host would produce for the same samples. ``result["shards"]`` records
   the hosts, the plan, the jobs and how ground truth was shared.

This module schedules the shards and writes the merged run; the state its phases share
is a `shard_job.ShardRun`.
"""

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
    """The whole run (see the module docstring): ground truth, plan, shards, merge."""
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
            # No separate look for the bundles: each job start runs it where it is and
            # pushes it where it is not (`remote_job.start_job`), once per host.
            # Every host's shard job starts once the ground-truth job has passed its
            # checks (quick: it loads nothing), beside it: their start-up (imports,
            # checks, the target's load) overlaps that phase.
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
            # hosts the plan left idle: their early jobs stop (in the background: a
            # start may still be under way)
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
                    # Re-plan what failed hosts left across every host free right now.
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
    """Evaluate `checkpoint` across the hosts (names or inventory groups) and merge into one
    local run folder ``<results_dir>/<run-id>`` (the shards' pulled folders under
    ``shards/``). Returns that folder. See the module docstring for the procedure. A host
    with a ``slurm`` role, named alone, runs the shards as one job array on its cluster
    instead (`slurm_eval.run_slurm_eval`), merged by the same code."""
    options = options or EvalOptions()
    specs = inventory.expand(host_names)
    if not specs:
        raise DflashError("--hosts names no host")
    # matplotlib is imported while the shards run, as a single-host eval does, not after
    # the merge on the way to the plots.
    pull.warm_plots()
    # it names a folder here and starts the shard jobs' ids: checked as a job id is
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
