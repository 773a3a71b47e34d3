"""The merged run of a sharded eval, one code for SSH hosts and a Slurm array."""

from __future__ import annotations

import json
import time

from orchestrator.eval.shards.job import ShardRun
from orchestrator.eval.shards.plan import merge_result
from orchestrator.eval.shards.truth import judge_ground_truth


def write_merged(
    run: ShardRun,
    *,
    results: list[dict],
    ordered: list[dict],
    shards: dict,
    gt_info: dict,
    gt_job: dict,
    hosts: list[str],
    t0: float,
    gt_workdir: str | None = None,
) -> dict:
    """Merge the shards' `results` and every record (in ground-truth order) into ``run.stage``,
    the ground truth judged by the merged agreement; the merged result."""
    result = merge_result(
        results,
        ordered,
        ground_truth_source=gt_info,
        shards=shards,
        job={"job_id": run.run_id, "hosts": hosts, "created": t0},
        wall_s=time.time() - t0,
    )
    agreement = result["metrics"].get("target_agreement")
    gt_info = judge_ground_truth(run, gt_info, agreement, gt_workdir)
    result["inputs"]["ground_truth_source"] = gt_info
    result["inputs"]["checkpoint"] = gt_job.get("checkpoint")
    result["inputs"]["prompts"] = gt_job.get("prompts")
    (run.stage / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ordered))
    (run.stage / "result.json").write_text(json.dumps(result, indent=2))
    (run.stage / "spec.json").write_text(
        json.dumps(
            {
                **{k: v for k, v in gt_job.items() if k != "stop_after"},
                "hosts": hosts,
                "job_id": run.run_id,
            },
            indent=2,
        )
    )
    (run.stage / "ground_truth.json").write_text(json.dumps(gt_info, indent=2))
    return result
