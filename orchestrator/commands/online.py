"""`dflash online`: the checkpoint served by a real serving engine beside dflash's offline
tau, on the same prompts and ground truth, and one verdict."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import (
    ContextLadderOption,
    DraftPolicyOption,
    DtypeOption,
    FreshGroundTruthOption,
    GroundTruthKindOption,
    GroundTruthOption,
    InventoryOption,
    JsonOption,
    MaxNewTokensOption,
    PromptsOption,
    ResultsDirOption,
    SamplesOption,
    SeedOption,
    TemperatureOption,
    ThreadsOption,
    TopKOption,
    TopPOption,
    inventory,
)
from orchestrator.eval.online import run as online
from orchestrator.eval.spec import EvalOptions, engine_spec


def online_cmd(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint",
            "-c",
            help="Drafter checkpoint: a name under the eval host's 'drafters' folder, or an "
            "absolute path there.",
            show_default=False,
        ),
    ],
    host: Annotated[
        str | None, typer.Option("--host", "-H", help="Eval host (default: defaults.eval_host).")
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="URL of a server already running with this drafter loaded, as the eval "
            "host reaches it: nothing is started (default: start vLLM with the inventory's "
            "roles.eval.serve.python).",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine", help="vllm | sglang: what --server is (default: the inventory's, vllm)."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Served model name to ask for (default: the server's).")
    ] = None,
    concurrency: Annotated[
        str,
        typer.Option(
            help="Requests in flight, one level or several (1,4,16): the same prompts at each "
            "level against the same server; acceptance and tokens/s per level.",
        ),
    ] = "1",
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline",
            help="Also start vLLM without the drafter and decode the same prompts: the "
            "engine's own speedup, measured (a second server start).",
        ),
    ] = False,
    baseline_server: Annotated[
        str | None,
        typer.Option(
            "--baseline-server",
            help="URL of a server already running the target without the drafter, as the "
            "eval host reaches it: the baseline, nothing started.",
        ),
    ] = None,
    prompts: PromptsOption = None,
    samples: SamplesOption = None,
    context_ladder: ContextLadderOption = None,
    seed: SeedOption = 0,
    temperature: TemperatureOption = 0.0,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    draft_policy: DraftPolicyOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    ground_truth: GroundTruthOption = None,
    ground_truth_kind: GroundTruthKindOption = None,
    fresh_ground_truth: FreshGroundTruthOption = False,
    dtype: DtypeOption = None,
    threads: ThreadsOption = None,
    results: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Is the tau my serving engine delivers the tau dflash measures? Serve the checkpoint
    with vLLM on the eval host (or read a running server), walk it offline on the same
    prompts and ground truth, and compare round by round: tau both ways, per position,
    lossless, and the cause when they differ: known engine deviations are tested by
    simulating them. Above --temperature 0 vLLM samples with per-request seeds and its tau
    is tested against the offline expectation along its own completions. --concurrency
    1,4,16 repeats the prompts at each batch size; --baseline measures the engine's own
    speedup against the target served alone.

    A detached job like remote-eval's: dflash jobs attach|cancel work on it, and the
    server it starts is stopped however it ends."""
    inv = inventory(ctx, inventory_path)
    eng, chosen = engine_spec(dtype=dtype, threads=threads, draft_policy=draft_policy)
    options = online.OnlineOptions(
        eval=EvalOptions(
            prompts=prompts,
            samples=samples,
            context_ladder=context_ladder,
            seed=seed,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            ground_truth=ground_truth,
            ground_truth_kind=ground_truth_kind,
            fresh_ground_truth=fresh_ground_truth,
            engine=eng,
            chosen=chosen,
        ),
        server=server,
        engine=engine,
        model=model,
        concurrency=concurrency,
        baseline=baseline,
        baseline_server=baseline_server,
    )
    with output.OnlineProgress(not json_out) as live:
        run_dir = online.run_online(
            inv,
            host,
            checkpoint,
            options,
            on_event=live,
            dest=results,
            on_start=lambda ref: output.job_started(ref.host)(ref),
        )
    output.emit(run_dir, json_out, human=output.render_online_run, as_json=output.online_json)


def register(app: typer.Typer) -> None:
    app.command("online")(online_cmd)
