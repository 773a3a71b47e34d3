"""`dflash parity`: compare two hosts' target features and the tau they give a drafter."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import (
    FreshGroundTruthOption,
    GroundTruthKindOption,
    GroundTruthOption,
    GtDeadlineOption,
    GtPhaseDeadlineOption,
    GtTimeoutOption,
    InventoryOption,
    JsonOption,
    MaxNewTokensOption,
    PromptsOption,
    ResultsDirOption,
    SamplesOption,
    SeedOption,
    ThreadsOption,
    inventory,
)
from orchestrator.errors import DflashError
from orchestrator.eval import hostjobs, parity


def parity_cmd(
    ctx: typer.Context,
    hosts: Annotated[
        str | None,
        typer.Option(
            "--hosts",
            help="A,B: A is the reference (e.g. the trainer), B compares (e.g. the "
            "eval host, where the drafter lies).",
        ),
    ] = None,
    model_a: Annotated[
        str | None, typer.Option(help="Target folder on A (default: A's roles.eval.target_model).")
    ] = None,
    model_b: Annotated[
        str | None, typer.Option(help="Target folder on B (default: B's roles.eval.target_model).")
    ] = None,
    prompts: PromptsOption = None,
    samples: SamplesOption = None,
    seed: SeedOption = 0,
    max_new_tokens: MaxNewTokensOption = None,
    ground_truth: GroundTruthOption = None,
    ground_truth_kind: GroundTruthKindOption = None,
    gt_timeout: GtTimeoutOption = None,
    gt_deadline: GtDeadlineOption = None,
    gt_phase_deadline: GtPhaseDeadlineOption = None,
    fresh_ground_truth: FreshGroundTruthOption = False,
    drafter: Annotated[
        str | None,
        typer.Option(
            "--drafter",
            help="Drafter checkpoint on B (a name under its drafters folder, or a "
            "path): adds tau on A's and on B's features.",
        ),
    ] = None,
    layers: Annotated[
        str | None,
        typer.Option(
            help="Target layers to compare, e.g. 0-5 or 1,3 (default: the drafter's target "
            "layers; all layers without a drafter)."
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="bf16 | fp32 on both hosts (default: B's inventory dtype, else bfloat16): "
            "both compute in one dtype unless --dtype-a/--dtype-b ask for two."
        ),
    ] = None,
    dtype_a: Annotated[
        str | None, typer.Option(help="bf16 | fp32 on A only (default: --dtype).")
    ] = None,
    dtype_b: Annotated[
        str | None, typer.Option(help="bf16 | fp32 on B only (default: --dtype).")
    ] = None,
    device_a: Annotated[str, typer.Option(help="cpu | cuda | cuda:N on A.")] = "cpu",
    device_b: Annotated[str, typer.Option(help="cpu | cuda | cuda:N on B.")] = "cpu",
    attn_a: Annotated[
        str | None,
        typer.Option(help="Attention implementation on A: sdpa | eager (default: transformers')."),
    ] = None,
    attn_b: Annotated[str | None, typer.Option(help="Same, on B.")] = None,
    topk: Annotated[int, typer.Option(min=1, help="Logits' top-k kept per token.")] = 8,
    allow_different_targets: Annotated[
        bool,
        typer.Option(
            "--allow-different-targets",
            help="Compare targets that are not copies of one checkpoint (their text configs "
            "or weights differ); refused otherwise, before anything is captured.",
        ),
    ] = False,
    threads: ThreadsOption = None,
    cancel: Annotated[
        str | None, typer.Option("--cancel", metavar="JOB", help="Stop parity job JOB on --host.")
    ] = None,
    attach: Annotated[
        str | None,
        typer.Option(
            "--attach",
            metavar="JOB",
            help="Resume watching compare job JOB on --host, then pull its result.",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Host of --cancel / --attach.")] = None,
    results: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Is my tau real? Compare the target features two hosts compute over the same tokens
    (per layer: cosine, relative L2, max abs error) and, with --drafter, the tau each host's
    features give the drafter.

    Both hosts are checked first (python, torch, the target, memory, and that both targets
    are copies of one checkpoint); nothing is captured until both pass."""
    inv = inventory(ctx, inventory_path)
    if cancel:
        if not host:
            raise DflashError("--cancel JOB needs --host HOST (the host the job runs on)")
        out = hostjobs.cancel_on(inv, host, cancel)
        output.emit(
            out, json_out, human=lambda o: output.render_cancelled(o, cancel, host, processes=False)
        )
        return
    if attach:
        if not host:
            raise DflashError("--attach JOB needs --host HOST (host B, where it compares)")
        run_dir = parity.attach(inv, host, attach, dest=results)
        output.emit(
            run_dir, json_out, human=output.render_parity_run, as_json=output.parity_attach_json
        )
        return
    names = [n.strip() for n in (hosts or "").split(",") if n.strip()]
    if len(names) != 2:
        raise DflashError("--hosts needs exactly two hosts, A,B (A the reference, B compares)")
    opts = parity.ParityOptions(
        model_a=model_a,
        model_b=model_b,
        prompts=prompts,
        samples=samples,
        seed=seed,
        max_new_tokens=max_new_tokens,
        ground_truth=ground_truth,
        ground_truth_kind=ground_truth_kind,
        ground_truth_timeout=gt_timeout,
        ground_truth_deadline=gt_deadline,
        ground_truth_phase_deadline=gt_phase_deadline,
        fresh_ground_truth=fresh_ground_truth,
        drafter=drafter,
        layers=parity.parse_layers(layers),
        dtype=dtype,
        dtype_a=dtype_a,
        dtype_b=dtype_b,
        device_a=device_a,
        device_b=device_b,
        attn_a=attn_a,
        attn_b=attn_b,
        topk=topk,
        threads=threads,
        allow_different_targets=allow_different_targets,
    )

    with output.ParityLines(enabled=not json_out) as lines:
        run_dir = parity.run_parity(
            inv, names[0], names[1], opts, on_event=lines, dest=results, on_start=lines.started
        )
    output.emit(run_dir, json_out, human=output.render_parity_run, as_json=output.parity_json)


def register(app: typer.Typer) -> None:
    app.command("parity")(parity_cmd)
