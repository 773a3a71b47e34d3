"""`dflash results list | show RUN | compare RUN_A RUN_B ... | plot`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from orchestrator import plots
from orchestrator import results as res
from orchestrator.commands.common import InventoryOption, JsonOption, console, print_json
from orchestrator.errors import DflashError
from orchestrator.inventory import InventoryError, load_inventory

results_app = typer.Typer(help="Read pulled eval results: list, show, compare, plot.",
                          no_args_is_help=True)

ResultsDirOption = Annotated[Optional[Path], typer.Option(
    "--results-dir", help="Results folder (default: the inventory's defaults.results_dir, "
    "else ./results).", show_default=False)]


def _root(results_dir: Optional[Path], inventory_path: Optional[Path]) -> Path:
    if results_dir:
        return results_dir
    try:
        return Path(load_inventory(inventory_path).defaults.results_dir)
    except InventoryError:
        if inventory_path:
            raise
        return Path("results")


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


@results_app.command("list")
def list_cmd(results_dir: ResultsDirOption = None, inventory_path: InventoryOption = None,
             json_out: JsonOption = False) -> None:
    """Every run in the results folder, oldest first."""
    root = _root(results_dir, inventory_path)
    runs = res.list_runs(root)
    if json_out:
        print_json([res.summary(r) for r in runs])
        return
    if not runs:
        console.print(f"no runs in {root}")
        return
    table = Table(title=f"runs in {root}")
    for col in ("run", "checkpoint", "host", "prompts", "samples", "tau", "tau (tokens)",
                "DDTree (largest)", "agreement", "ground truth"):
        table.add_column(col)
    for r in runs:
        s = res.summary(r)
        dd = list(s["ddtree"].items())
        table.add_row(s["run_id"], s["checkpoint"], fmt(s["host"]), fmt(s["prompts"]),
                      fmt(s["samples"]), fmt(s["tau"]), fmt(s["tau_tokens"]),
                      f"{dd[-1][0]}: {fmt(dd[-1][1])}" if dd else "-",
                      pct(s["target_agreement"]), fmt(s["ground_truth"]))
    console.print(table)


def render_summary(run: res.Run) -> None:
    """The headline table of one run (also printed at the end of `remote-eval`)."""
    s = res.summary(run)
    table = Table(title=f"{s['checkpoint']}  ({s['run_id']})", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    table.add_row("tau (z-lab: mean of per-sample means)", fmt(s["tau"]))
    table.add_row("tau (token-weighted: tokens / rounds)", fmt(s["tau_tokens"]))
    for b, v in s["ddtree"].items():
        table.add_row(f"DDTree-{b} tau", fmt(v))
    table.add_row("target agreement", pct(s["target_agreement"]))
    table.add_row("samples / tokens / rounds",
                  f"{fmt(s['samples'])} / {fmt(s['tokens'])} / {fmt(s['rounds'])}")
    gt = res.ground_truth_source(run)
    src = gt.get("kind") or "-"
    if gt.get("url"):
        src += f" {gt['url']}"
    if gt.get("cached"):
        src += " (cached on host)"
    table.add_row("ground truth", src)
    if s["retokenisation_mismatch"] is not None:
        table.add_row("retokenisation mismatch", f"[yellow]{pct(s['retokenisation_mismatch'])}[/]")
    console.print(table)
    for w in gt.get("warnings") or []:
        console.print(f"[bold yellow]warning:[/] {w}", soft_wrap=True)


def _kv_table(title: str, data: dict) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for k, v in _flatten(data):
        table.add_row(k, fmt(v) if not isinstance(v, (list, dict)) else json.dumps(v)[:120])
    return table


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if not isinstance(data, dict):
        return [(prefix or "value", data)]
    out = []
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out += _flatten(v, key)
        else:
            out.append((key, v))
    return out


@results_app.command("show")
def show_cmd(run_id: Annotated[str, typer.Argument(help="Run id (or unique part) or folder.")],
             results_dir: ResultsDirOption = None, inventory_path: InventoryOption = None,
             json_out: JsonOption = False) -> None:
    """One run in full: tau, DDTree budgets, histogram, per-position acceptance, target
    agreement, timings, environment."""
    run = res.load_run(run_id, _root(results_dir, inventory_path))
    if json_out:
        print_json(run.result)
        return
    render_summary(run)
    m = run.metrics
    dd = m.get("ddtree") or {}
    if dd:
        t = Table(title="DDTree budgets")
        for col in ("budget (nodes)", "per-depth top-k", "tau", "tau (tokens)", "rounds"):
            t.add_column(col)
        for b, v in sorted(dd.items(), key=lambda kv: res._num(kv[0])):
            t.add_row(str(v.get("budget", b)), fmt(v.get("topk")),
                      fmt(v.get("tau_per_sample_mean")), fmt(v.get("tau_token_weighted")),
                      fmt(v.get("rounds")))
        console.print(t)
    hist = res.histogram(run)
    if hist:
        total = sum(c for _, c in hist) or 1
        t = Table(title="acceptance histogram")
        for col in ("length", "rounds", "share", ""):
            t.add_column(col)
        for k, c in hist:
            t.add_row(str(k), str(c), pct(c / total), "#" * round(40 * c / total))
        console.print(t)
    pos = res.per_position(run)
    if pos:
        t = Table(title="per-position acceptance (position j correct given 1..j-1 correct)")
        for col in ("position", "attempts", "accepted", "rate"):
            t.add_column(col)
        for p in pos:
            t.add_row(str(p.get("position")), fmt(p.get("attempts")), fmt(p.get("accepted")),
                      pct(p.get("rate")))
        console.print(t)
    agreement = m.get("target_agreement")
    if agreement:
        console.print(_kv_table("target agreement (host argmax = ground truth)", agreement))
    for key, title in (("timings", "timings"), ("environment", "environment")):
        if run.result.get(key):
            console.print(_kv_table(title, run.result[key]))
    gt = res.ground_truth_source(run)
    if gt:
        console.print(_kv_table("ground truth source",
                                {k: v for k, v in gt.items() if k != "warnings"}))
    pngs = sorted(p.name for p in run.path.glob("*.png"))
    console.print(f"folder: {run.path}" + (f"  plots: {', '.join(pngs)}" if pngs else ""))


@results_app.command("compare")
def compare_cmd(run_ids: Annotated[list[str], typer.Argument(help="Two or more runs.")],
                results_dir: ResultsDirOption = None, inventory_path: InventoryOption = None,
                json_out: JsonOption = False) -> None:
    """Runs side by side (e.g. step 8000 against step 12000, or against a reference)."""
    if len(run_ids) < 2:
        raise DflashError("compare needs at least two runs")
    root = _root(results_dir, inventory_path)
    runs = [res.load_run(r, root) for r in run_ids]
    rows = res.compare_rows(runs)
    if json_out:
        print_json({"runs": [r.run_id for r in runs],
                    "rows": [{"metric": k, "values": v} for k, v in rows]})
        return
    t = Table(title="comparison")
    t.add_column("metric", style="bold")
    for r in runs:
        t.add_column(r.run_id)
    for metric, values in rows:
        is_share = metric.startswith(("share", "target", "retok"))
        t.add_row(metric, *[pct(v) if is_share and isinstance(v, float) else fmt(v)
                            for v in values])
    console.print(t)
    png = plots.plot_tau_by_step(runs, root / "compare_tau_by_step.png") if root.is_dir() else None
    if png:
        console.print(f"plot: {png}")


@results_app.command("plot")
def plot_cmd(run_ids: Annotated[Optional[list[str]], typer.Argument(
                 help="Runs to draw (default: all).")] = None,
             results_dir: ResultsDirOption = None, inventory_path: InventoryOption = None) -> None:
    """(Re)draw each run's plots and the tau-per-step plot of the runs."""
    root = _root(results_dir, inventory_path)
    runs = [res.load_run(r, root) for r in run_ids] if run_ids else res.list_runs(root)
    if not runs:
        raise DflashError(f"no runs in {root}")
    for r in runs:
        for p in plots.plot_run(r):
            console.print(str(p))
    png = plots.plot_tau_by_step(runs, root / "tau_by_step.png")
    if png:
        console.print(str(png))


def register(app: typer.Typer) -> None:
    app.add_typer(results_app, name="results")
