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
from orchestrator.eval.parity import run as parity
from remote.protocol import ATTN_IMPLEMENTATIONS, CAPTURE_TOPK


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
        typer.Option(
            help=f"Attention implementation on A: {' | '.join(ATTN_IMPLEMENTATIONS)} "
            "(default: transformers')."
        ),
    ] = None,
    attn_b: Annotated[str | None, typer.Option(help="Same, on B.")] = None,
    topk: Annotated[int, typer.Option(min=1, help="Logits' top-k kept per token.")] = CAPTURE_TOPK,
    allow_different_targets: Annotated[
        bool,
        typer.Option(
            "--allow-different-targets",
            help="Compare targets that are not copies of one checkpoint (their text configs "
            "or weights differ); refused otherwise, before anything is captured.",
        ),
    ] = False,
    threads: ThreadsOption = None,
    results: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Is my tau real? Compare the target features two hosts compute over the same tokens
    (per layer: cosine, relative L2, max abs error) and, with --drafter, the tau each host's
    features give the drafter.

    Both hosts are checked first (python, torch, the target, memory, and that both targets
    are copies of one checkpoint); nothing is captured until both pass. Its jobs are
    listed, attached to and cancelled with dflash jobs. Greedy always: no temperature
    changes the forwards it compares (docs/parity.md)."""
    inv = inventory(ctx, inventory_path)
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
    request = parity.parity_request(inv, hosts, opts)

    with output.ParityLines(enabled=not json_out) as lines:
        run_dir = parity.run_parity(
            request.inventory,
            request.host_a,
            request.host_b,
            request.options,
            on_event=lines,
            dest=results,
            on_start=lines.started,
        )
    output.emit(run_dir, json_out, human=output.render_parity_run, as_json=output.parity_json)


def register(app: typer.Typer) -> None:
    app.command("parity")(parity_cmd)
