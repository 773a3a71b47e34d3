"""`dflash remote-eval`: evaluate a checkpoint on the eval host (and wait, or --detach), or
sharded across --hosts. Attaching to and cancelling jobs: `dflash jobs`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import (
    BudgetsOption,
    ContextLadderOption,
    DeviceOption,
    DraftPolicyOption,
    DtypeOption,
    FeatureCacheOption,
    FreshGroundTruthOption,
    GroundTruthKindOption,
    GroundTruthOption,
    GtDeadlineOption,
    GtPhaseDeadlineOption,
    GtSamplesOption,
    GtTimeoutOption,
    InventoryOption,
    JsonOption,
    MaxNewTokensOption,
    PositionsOption,
    PromptsOption,
    ResultsDirOption,
    SamplesOption,
    SeedOption,
    ThreadsOption,
    TopKOption,
    TopkOption,
    TopPOption,
    inventory,
    stopped_by_signal,
)
from orchestrator.eval import run as remote_eval
from orchestrator.eval import sweep
from orchestrator.eval.job import JobRef
from orchestrator.eval.request import eval_request
from orchestrator.eval.shards import run as shard
from orchestrator.eval.spec import EvalOptions, engine_spec
from orchestrator.eval.sweep import requested, run_sweep
from orchestrator.results import store as res
from orchestrator.results import sweep as sweep_view
from remote.protocol import GT_DEFAULT_CONCURRENCY as GT_CONCURRENCY


def remote_eval_cmd(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint",
            "-c",
            help="Drafter checkpoint: a name under the eval host's "
            "'drafters' folder, or an absolute path there.",
            show_default=False,
        ),
    ],
    host: Annotated[
        str | None, typer.Option("--host", "-H", help="Eval host (default: defaults.eval_host).")
    ] = None,
    hosts: Annotated[
        str | None,
        typer.Option(
            "--hosts",
            help="Shard the samples across these eval hosts (comma-separated names "
            "or inventory groups) and merge into one result; a Slurm login node "
            "(roles.slurm), named alone, runs the shards as one job array.",
        ),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach", help="Start the job and return; watch it later with dflash jobs attach."
        ),
    ] = False,
    prompts: PromptsOption = None,
    samples: SamplesOption = None,
    context_ladder: ContextLadderOption = None,
    seed: SeedOption = 0,
    max_new_tokens: MaxNewTokensOption = None,
    thinking: Annotated[
        bool,
        typer.Option(
            "--thinking/--no-thinking",
            help="Chat template with thinking on or off (enable_thinking).",
        ),
    ] = False,
    temperature: Annotated[
        str | None,
        typer.Option(
            help="Temperature the ground truth is sampled at and tau is computed for (0, the "
            "default: greedy; above 0: speculative-sampling acceptance in expectation, "
            "docs/dflash-eval.md); several comma-separated (0,0.6,1.0) sweep them: one run "
            "per temperature and a table of tau against it (docs/eval.md).",
            show_default=False,
        ),
    ] = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    draft_policy: DraftPolicyOption = None,
    gt_samples: GtSamplesOption = None,
    ground_truth: GroundTruthOption = None,
    ground_truth_kind: GroundTruthKindOption = None,
    ground_truth_model: Annotated[
        str | None,
        typer.Option(help="Model name for OpenAI-compatible servers (default: the first served)."),
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="Target model folder on the host (default: the inventory's).")
    ] = None,
    gt_concurrency: Annotated[
        int | None,
        typer.Option(
            "--gt-concurrency",
            min=1,
            help="Ground-truth requests in flight at once (default: the inventory's, else "
            f"{GT_CONCURRENCY}); servers batch them.",
        ),
    ] = None,
    gt_timeout: GtTimeoutOption = None,
    gt_deadline: GtDeadlineOption = None,
    gt_phase_deadline: GtPhaseDeadlineOption = None,
    fresh_ground_truth: FreshGroundTruthOption = False,
    feature_cache: FeatureCacheOption = True,
    dtype: DtypeOption = None,
    threads: ThreadsOption = None,
    budgets: BudgetsOption = None,
    topk: TopkOption = None,
    positions: PositionsOption = None,
    device: DeviceOption = None,
    results: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Evaluate a drafter checkpoint ON the eval host, detached; watch it; pull the results.

    The job survives a dropped connection or a killed dflash: resume with dflash jobs
    attach JOB.
    """
    inv = inventory(ctx, inventory_path)
    engine, chosen = engine_spec(
        dtype=dtype,
        threads=threads,
        budgets=budgets,
        topk=topk,
        positions=positions,
        device=device,
        draft_policy=draft_policy,
    )
    temps, temperature = requested(temperature)
    options = EvalOptions(
        prompts=prompts,
        samples=samples,
        context_ladder=context_ladder,
        seed=seed,
        max_new_tokens=max_new_tokens,
        thinking=thinking,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        gt_samples=gt_samples,
        ground_truth=ground_truth,
        ground_truth_kind=ground_truth_kind,
        ground_truth_model=ground_truth_model,
        ground_truth_concurrency=gt_concurrency,
        ground_truth_timeout=gt_timeout,
        ground_truth_deadline=gt_deadline,
        ground_truth_phase_deadline=gt_phase_deadline,
        fresh_ground_truth=fresh_ground_truth,
        feature_cache=feature_cache,
        target=target,
        engine=engine,
        chosen=chosen,
    )
    request = eval_request(inv, checkpoint, options, host=host, hosts=hosts, detach=detach)
    if len(temps) > 1:
        sweep.check(options, inv.expand(request.hosts or [request.host]), request.detach)
    output.notes(request.notes)
    show = not json_out
    if len(temps) > 1:
        _sweep(inv, request, checkpoint, options, temps, results, json_out)
        return
    if request.hosts:
        # SIGTERM as Ctrl-C: a Slurm array is cancelled on the way out, nothing left queued
        with stopped_by_signal(), output.SlurmShardProgress(show) as live:
            run_dir = shard.run_sharded(
                inv, request.hosts, checkpoint, options, on_event=live, dest=results
            )
    elif request.detach:
        ref = remote_eval.start_eval(inv, request.host, checkpoint, options)
        output.emit(ref, json_out, human=output.render_started, as_json=JobRef.to_json)
        return
    else:
        with output.LiveProgress(show) as live:
            run_dir = remote_eval.run_eval(
                inv,
                request.host,
                checkpoint,
                options,
                on_event=live,
                dest=results,
                on_start=output.job_started(request.host),
            )
    _report(run_dir, json_out)


def _sweep(inv, request, checkpoint, options, temps, results, json_out: bool) -> None:
    """One run per temperature (each as a single eval runs), then the sweep's table."""
    show = not json_out

    def one(opts: EvalOptions):
        at = temps.index(opts.temperature) + 1
        output.notes([f"temperature {opts.temperature:g}: run {at} of {len(temps)}"])
        if request.hosts:
            with stopped_by_signal(), output.SlurmShardProgress(show) as live:
                return shard.run_sharded(
                    inv, request.hosts, checkpoint, opts, on_event=live, dest=results
                )
        with output.LiveProgress(show) as live:
            return remote_eval.run_eval(
                inv, request.host, checkpoint, opts, on_event=live, dest=results
            )

    done = run_sweep(one, options, temps, checkpoint)
    output.emit(done, json_out, human=output.render_sweep, as_json=sweep_view.to_json)


def _report(run_dir, json_out: bool) -> None:
    """The pulled run, summarised (the one rendering of every eval path above)."""
    output.emit(
        res.load_run(run_dir), json_out, human=output.render_eval_run, as_json=output.eval_run_json
    )


def register(app: typer.Typer) -> None:
    app.command("remote-eval")(remote_eval_cmd)
