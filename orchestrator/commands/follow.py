"""`dflash follow`: relay and evaluate each new checkpoint of a training run, exactly once."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import (
    BudgetsOption,
    ContextLadderOption,
    DraftPolicyOption,
    DtypeOption,
    FeatureCacheOption,
    GtDeadlineOption,
    GtPhaseDeadlineOption,
    GtSamplesOption,
    GtTimeoutOption,
    InventoryOption,
    JsonOption,
    MaxNewTokensOption,
    PromptsOption,
    ResultsDirOption,
    SamplesOption,
    SeedOption,
    TemperatureOption,
    TopKOption,
    TopPOption,
    inventory,
    positive,
    stopped_by_signal,
)
from orchestrator.eval.follow import loop as follow_lib
from orchestrator.eval.spec import EvalOptions, engine_spec


def follow_cmd(
    ctx: typer.Context,
    source: Annotated[
        str | None, typer.Option("--from", help="Trainer host (default: defaults.relay_from).")
    ] = None,
    dest: Annotated[
        str | None, typer.Option("--to", help="Eval host (default: defaults.relay_to).")
    ] = None,
    keep: Annotated[
        int | None,
        typer.Option(
            "--keep",
            min=1,
            help="Keep only the newest K relayed checkpoints on the eval host "
            "(pruned after each eval; default: defaults.keep).",
        ),
    ] = None,
    interval: Annotated[
        float,
        typer.Option("--interval", callback=positive, help="Seconds between looks at the trainer."),
    ] = 60.0,
    once: Annotated[
        bool, typer.Option("--once", help="One pass (evaluate what is new now), then exit.")
    ] = False,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe/--no-probe",
            help="Check each checkpoint fits the target (probe-structure) before evaluating it.",
        ),
    ] = False,
    prompts: PromptsOption = None,
    samples: SamplesOption = None,
    context_ladder: ContextLadderOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    seed: SeedOption = 0,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    draft_policy: DraftPolicyOption = None,
    gt_samples: GtSamplesOption = None,
    budgets: BudgetsOption = None,
    dtype: DtypeOption = None,
    gt_timeout: GtTimeoutOption = None,
    gt_deadline: GtDeadlineOption = None,
    gt_phase_deadline: GtPhaseDeadlineOption = None,
    fresh_ground_truth: Annotated[
        bool,
        typer.Option(
            "--fresh-ground-truth",
            help="Make the ground truth again for the first checkpoint this run evaluates "
            "instead of reusing the eval host's cached entry; later ones reuse the new one.",
        ),
    ] = False,
    feature_cache: FeatureCacheOption = True,
    results: ResultsDirOption = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state-dir",
            help="Follow folder: history, state, plot (default: <results>/follow/<from>-to-<to>).",
        ),
    ] = None,
    tensorboard: Annotated[
        str | None,
        typer.Option(
            "--tensorboard",
            metavar="DIR",
            help="Also log each run's tau, token-weighted tau, "
            "DDTree tau per budget and agreement to TensorBoard event files under DIR, at the "
            "checkpoint's training step.",
        ),
    ] = None,
    wandb: Annotated[
        str | None,
        typer.Option(
            "--wandb",
            metavar="PROJECT",
            help="Also log them to this W&B project (offline "
            "files in the follow folder unless WANDB_MODE=online; upload with wandb sync).",
        ),
    ] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Relay and evaluate every new checkpoint of a training run, exactly once.

    Appends to a history and redraws the tau-per-step plot. A checkpoint already evaluated
    with the same settings (a run in the results folder, e.g. from remote-eval) is recorded,
    not evaluated again. Safe to stop and restart: Ctrl-C (exit 130) or SIGTERM (exit 143)
    cancels the running eval job and ends with one line; the history is kept, and a restart
    attaches to a job a crash left running."""
    inv = inventory(ctx, inventory_path)
    engine, chosen = engine_spec(dtype=dtype, budgets=budgets, draft_policy=draft_policy)
    request = follow_lib.follow_request(
        inv,
        source,
        dest,
        keep=keep,
        interval=interval,
        probe=probe,
        results_dir=results,
        state_dir=state,
        tensorboard=tensorboard,
        wandb=wandb,
        eval=EvalOptions(
            prompts=prompts,
            samples=samples,
            context_ladder=context_ladder,
            max_new_tokens=max_new_tokens,
            seed=seed,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            gt_samples=gt_samples,
            ground_truth_timeout=gt_timeout,
            ground_truth_deadline=gt_deadline,
            ground_truth_phase_deadline=gt_phase_deadline,
            fresh_ground_truth=fresh_ground_truth,
            feature_cache=feature_cache,
            engine=engine,
            chosen=chosen,
        ),
    )
    # A polite stop (kill, systemd) behaves like Ctrl-C: the running job is cancelled, and
    # the command ends with one line and the shell's exit code for that signal.
    output.notes(request.notes)
    note = "; the history is kept: run dflash follow again to go on"
    with stopped_by_signal(note), output.RichEvents(enabled=not json_out) as events:
        run = follow_lib.follow_pass if once else follow_lib.follow
        run(request.inventory, request.source, request.dest, request.options, events)
    folder = follow_lib.state_dir(request.inventory, request.source, request.dest, request.options)
    output.emit(folder, json_out, human=output.render_follow, as_json=output.follow_json)


def register(app: typer.Typer) -> None:
    app.command("follow")(follow_cmd)
