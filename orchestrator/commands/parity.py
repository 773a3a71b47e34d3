"""`dflash parity`: compare two hosts' target features and the tau they give a drafter."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from orchestrator import parity, parity_view, remote_eval
from orchestrator.commands.common import (InventoryOption, JsonOption, console, err_console,
                                          inventory, print_json)
from orchestrator.errors import DflashError
from orchestrator.hosts import open_host


def parity_cmd(
    hosts: Annotated[Optional[str], typer.Option(
        "--hosts", help="A,B: A is the reference (e.g. the trainer), B compares (e.g. the "
        "eval host, where the drafter lies).")] = None,
    model_a: Annotated[Optional[str], typer.Option(
        help="Target folder on A (default: A's roles.eval.target_model).")] = None,
    model_b: Annotated[Optional[str], typer.Option(
        help="Target folder on B (default: B's roles.eval.target_model).")] = None,
    prompts: Annotated[Optional[str], typer.Option(
        help="Built-in set (math, code, chat), a local JSONL file, or host:/path on B.")] = None,
    samples: Annotated[Optional[int], typer.Option(min=1, help="Prompts to use.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the prompt choice.")] = 0,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        min=1, help="Ground-truth completion length.")] = None,
    ground_truth: Annotated[Optional[str], typer.Option(
        help="Ground-truth server URL as seen from B, or a file on B (default: B's).")] = None,
    ground_truth_kind: Annotated[Optional[str], typer.Option(
        help="sglang | openai | openai-text | file | local.")] = None,
    drafter: Annotated[Optional[str], typer.Option(
        "--drafter", help="Drafter checkpoint on B (a name under its drafters folder, or a "
        "path): adds tau on A's and on B's features.")] = None,
    layers: Annotated[Optional[str], typer.Option(
        help="Target layers to compare, e.g. 0-5 or 1,3 (default: the drafter's target "
        "layers; all layers without a drafter).")] = None,
    dtype_a: Annotated[Optional[str], typer.Option(help="bf16 | fp32 on A.")] = None,
    dtype_b: Annotated[Optional[str], typer.Option(help="bf16 | fp32 on B.")] = None,
    device_a: Annotated[str, typer.Option(help="cpu | cuda | cuda:N on A.")] = "cpu",
    device_b: Annotated[str, typer.Option(help="cpu | cuda | cuda:N on B.")] = "cpu",
    attn_a: Annotated[Optional[str], typer.Option(
        help="Attention implementation on A: sdpa | eager (default: transformers').")] = None,
    attn_b: Annotated[Optional[str], typer.Option(help="Same, on B.")] = None,
    topk: Annotated[int, typer.Option(min=1, help="Logits' top-k kept per token.")] = 8,
    threads: Annotated[Optional[int], typer.Option(min=1, help="CPU threads per host.")] = None,
    cancel: Annotated[Optional[str], typer.Option(
        "--cancel", metavar="JOB", help="Stop parity job JOB on --host.")] = None,
    attach: Annotated[Optional[str], typer.Option(
        "--attach", metavar="JOB", help="Resume watching compare job JOB on --host, then "
        "pull its result.")] = None,
    host: Annotated[Optional[str], typer.Option(
        "--host", help="Host of --cancel / --attach.")] = None,
    results: Annotated[Optional[str], typer.Option(
        "--results-dir", help="Local results folder (default: defaults.results_dir).")] = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Is my tau real? Compare the target features two hosts compute over the same tokens
    (per layer: cosine, relative L2, max abs error) and, with --drafter, the tau each host's
    features give the drafter."""
    inv = inventory(inventory_path)
    if cancel:
        if not host:
            raise DflashError("--cancel JOB needs --host HOST (the host the job runs on)")
        with open_host(inv.host(host), inv) as h:
            out = remote_eval.cancel(h, cancel)
        print_json(out) if json_out else console.print(
            f"job {cancel} on {host}: {out['state']} (was {out['was']})")
        return
    if attach:
        if not host:
            raise DflashError("--attach JOB needs --host HOST (host B, where it compares)")
        run_dir = parity.attach(inv, host, attach, dest=results)
        result = parity.load(run_dir)
        print_json({"run_dir": str(run_dir), "result": result}) if json_out else \
            render(result, run_dir)
        return
    names = [n.strip() for n in (hosts or "").split(",") if n.strip()]
    if len(names) != 2:
        raise DflashError("--hosts needs exactly two hosts, A,B (A the reference, B compares)")
    opts = parity.ParityOptions(
        model_a=model_a, model_b=model_b, prompts=prompts, samples=samples, seed=seed,
        max_new_tokens=max_new_tokens, ground_truth=ground_truth,
        ground_truth_kind=ground_truth_kind, drafter=drafter,
        layers=parity.parse_layers(layers), dtype_a=dtype_a, dtype_b=dtype_b,
        device_a=device_a, device_b=device_b, attn_a=attn_a, attn_b=attn_b, topk=topk,
        threads=threads)

    def started(stage: str, ref: remote_eval.JobRef) -> None:
        if not json_out:
            err_console.print(f"{stage}: job {ref.job_id} on {ref.host}")

    def progress(stage: str, ev: dict) -> None:
        if not json_out and ev.get("event") == "sample":
            err_console.print(f"  {stage}: {ev.get('done')}/{ev.get('total')}", end="\r")
        elif not json_out and ev.get("event") == "warning":
            err_console.print(f"[yellow]warning ({stage}):[/] {ev.get('message')}")

    run_dir = parity.run_parity(inv, names[0], names[1], opts, on_event=progress,
                                dest=results, on_start=started)
    result = parity.load(run_dir)
    if json_out:
        print_json({"run_dir": str(run_dir), "run_id": run_dir.name,
                    "summary": parity_view.summary(result, run_dir.name), "result": result})
        return
    render(result, run_dir)


def render(result: dict, run_dir: Path) -> None:
    """The parity table: sides, per-layer errors, top-1 agreement, tau A/B."""
    console.print(f"A: {parity_view.side_label(result, 'a')}")
    console.print(f"B: {parity_view.side_label(result, 'b')}")
    for side in ("a", "b"):
        k = ((result.get("captures") or {}).get(side) or {}).get("kernels") or {}
        console.print(f"  kernels on {side.upper()}: " + ", ".join(
            f"{n} {v.get('version') or 'absent'}" for n, v in k.items()))
    tokens = (result.get("layers") or [{}])[0].get("tokens", "?")
    t = Table(title=f"features per layer ({result.get('samples')} samples, {tokens} tokens; "
                    "A = reference)")
    for col in parity_view.LAYER_COLUMNS:
        t.add_column(col, justify="right")
    for row in parity_view.layer_rows(result):
        t.add_row(*row)
    console.print(t)
    top1 = result.get("top1_agreement") or {}
    rate = top1.get("rate")
    console.print(f"top-1 agreement of the logits: {top1.get('match')}/{top1.get('total')}"
                  + (f" ({rate:.2%})" if rate is not None else ""))
    d = result.get("drafter")
    if d:
        console.print(f"drafter {d['path']} (layers {d['target_layer_ids']}):  tau A "
                      f"{d['tau_a']:.4f}  tau B {d['tau_b']:.4f}  delta tau (B - A) "
                      f"{d['delta_tau']:+.4f}  samples diverging {d['samples_diverging']}/"
                      f"{len(d['per_sample'])}")
    if result.get("identical"):
        console.print("[green]identical: the hosts compute the same features bit for bit[/]")
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    console.print(f"results: {run_dir}" + (f"  plot: {', '.join(pngs)}" if pngs else ""))


def register(app: typer.Typer) -> None:
    app.command("parity")(parity_cmd)
