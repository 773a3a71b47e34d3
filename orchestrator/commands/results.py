"""`dflash results list | show | compare | plot | export | report`: thin layers over
`orchestrator.results.store`, `.compare`, `.plots`, `.export` and `.report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from orchestrator.commands.common import InventoryOption, JsonOption
from orchestrator.commands.output import (
    compact,
    console,
    fmt,
    pct,
    print_json,
    render_parity,
    render_summary,
)
from orchestrator.errors import DflashError
from orchestrator.eval import run as remote_eval
from orchestrator.inventory import InventoryError, load_inventory
from orchestrator.results import compare as cmp
from orchestrator.results import export as exp
from orchestrator.results import plots
from orchestrator.results import report as rep
from orchestrator.results import store as res

results_app = typer.Typer(
    help="Read pulled eval results: list, show, compare, plot, export, report.",
    no_args_is_help=True,
)

ResultsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--results-dir",
        help="Results folder (default: the inventory's defaults.results_dir, "
        "relative to the inventory file; else ./results).",
        show_default=False,
    ),
]
RunsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help="Run ids, unique prefixes or folders (default: every run).", show_default=False
    ),
]
# Keys whose numbers are Unix times: shown as dates.
TIME_KEYS = {"generated", "created", "pulled", "time", "started", "finished", "made"}


def _root(results_dir: Path | None, inventory_path: Path | None) -> Path:
    if results_dir:
        return results_dir
    try:
        return remote_eval.results_dir(load_inventory(inventory_path))
    except InventoryError:
        if inventory_path:
            raise
        return Path("results")


def _runs(run_ids: list[str] | None, root: Path) -> list[res.Run]:
    runs = [res.load_run(r, root) for r in run_ids] if run_ids else res.list_runs(root)
    if not runs:
        raise DflashError(
            f"no runs in {root} (pull one with dflash remote-eval, or pass --results-dir)"
        )
    return runs


@results_app.command("list")
def list_cmd(
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Every run in the results folder, oldest first, by its full id.

    show and compare take that id, or a unique prefix of it."""
    root = _root(results_dir, inventory_path)
    runs = res.list_runs(root)
    from orchestrator.eval import parity
    from orchestrator.results import parity_view

    parity_runs = parity.list_runs(root)
    if json_out:
        print_json(
            [res.summary(r) for r in runs]
            + [parity_view.summary(r, p.name) for p, r in parity_runs]
        )
        return
    if parity_runs:
        t = compact("parity runs")
        for col in ("run", "A", "B", "worst relL2 p99", "top-1", "delta tau"):
            t.add_column(col, no_wrap=True)
        for p, r in parity_runs:
            s = parity_view.summary(r, p.name)
            t.add_row(
                p.name,
                s["a"],
                s["b"],
                fmt(s["worst_rel_l2_p99"]),
                pct(s["top1_agreement"]),
                fmt(s["delta_tau"]),
            )
        console.print(t)
    if not runs:
        console.print(f"no runs in {root}", soft_wrap=True)
        return
    table = compact(f"runs in {root}")
    for col in ("run", "step", "tau", "tau tok", "DDTree max", "agree", "evaluated"):
        table.add_column(col, no_wrap=True, justify="left" if col == "run" else "right")
    for r in runs:
        s = res.summary(r)
        dd = list(s["ddtree"].items())
        table.add_row(
            s["run_id"],
            fmt(s["step"]),
            fmt(s["tau"]),
            fmt(s["tau_tokens"]),
            f"{dd[-1][0]}: {fmt(dd[-1][1])}" if dd else "-",
            pct(s["target_agreement"]),
            s["created_time"][5:16],
        )
    console.print(table)


def _kv_table(title: str, data: dict) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in _flatten(data):
        if k.rsplit(".", 1)[-1] in TIME_KEYS and isinstance(v, (int, float)) and v > 1e8:
            table.add_row(k, res.format_time(v))
            continue
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
def show_cmd(
    run_id: Annotated[str, typer.Argument(help="Run id (or unique part) or folder.")],
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """One run in full: tau, DDTree budgets, histogram, per-position acceptance, target
    agreement, timings, environment."""
    from orchestrator.eval import parity

    root = _root(results_dir, inventory_path)
    folder = Path(run_id) if (Path(run_id) / "result.json").is_file() else None
    for p, _r in [] if folder else parity.list_runs(root):
        if p.name == run_id or (folder is None and p.name.startswith(run_id)):
            folder = p
            break
    if folder is not None and parity.is_parity_run(folder):
        result = parity.load(folder)
        print_json(result) if json_out else render_parity(result, folder)
        return
    run = res.load_run(run_id, root)
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
        for b, v in sorted(dd.items(), key=lambda kv: res.budget_key(kv[0])):
            t.add_row(
                str(v.get("budget", b)),
                fmt(v.get("topk")),
                fmt(v.get("tau_per_sample_mean")),
                fmt(v.get("tau_token_weighted")),
                fmt(v.get("rounds")),
            )
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
            t.add_row(
                str(p.get("position")),
                fmt(p.get("attempts")),
                fmt(p.get("accepted")),
                pct(p.get("rate")),
            )
        console.print(t)
    agreement = m.get("target_agreement")
    if agreement:
        console.print(_kv_table("target agreement (host argmax = ground truth)", agreement))
    for key, title in (("timings", "timings"), ("environment", "environment")):
        if run.result.get(key):
            console.print(_kv_table(title, run.result[key]))
    gt = res.ground_truth_source(run)
    if gt:
        console.print(
            _kv_table("ground truth source", {k: v for k, v in gt.items() if k != "warnings"})
        )
    pngs = sorted(p.name for p in run.path.glob("*.png"))
    console.print(f"folder: {run.path}" + (f"  plots: {', '.join(pngs)}" if pngs else ""))


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"R{i}"


@results_app.command("compare")
def compare_cmd(
    run_ids: Annotated[
        list[str],
        typer.Argument(
            help="Two or more runs (ids, unique prefixes or folders); the first is the baseline."
        ),
    ],
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also draw their tau by training step into this PNG."),
    ] = None,
    resamples: Annotated[
        int, typer.Option(min=100, help="Bootstrap resamples for the interval.")
    ] = cmp.RESAMPLES,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Runs side by side, and each against the first, paired sample by sample.

    Reports the mean delta tau with a bootstrap 95% interval and the share of samples that
    improved. Runs over different prompts, ground truth, target or dtype are reported as
    not comparable."""
    if len(run_ids) < 2:
        raise DflashError("compare needs at least two runs")
    root = _root(results_dir, inventory_path)
    runs = [res.load_run(r, root) for r in run_ids]
    rows = res.compare_rows(runs)
    pairs = [cmp.paired(runs[0], r, resamples=resamples, seed=seed) for r in runs[1:]]
    png = plots.plot_tau_by_step(runs, plot) if plot else None
    if json_out:
        print_json(
            {
                "runs": [r.run_id for r in runs],
                "rows": [{"metric": k, "values": v} for k, v in rows],
                "paired": [p.to_json() for p in pairs],
                "plot": str(png) if png else None,
            }
        )
        return
    for i, r in enumerate(runs):
        console.print(f"{_label(i)}: {r.run_id}", soft_wrap=True)
    t = compact("side by side")
    t.add_column("metric", style="bold", no_wrap=True)
    for i, _ in enumerate(runs):
        t.add_column(_label(i), justify="right")
    for metric, values in rows:
        is_share = metric.startswith(("share", "target", "retok"))
        t.add_row(
            metric, *[pct(v) if is_share and isinstance(v, float) else fmt(v) for v in values]
        )
    console.print(t)
    for i, p in enumerate(pairs, 1):
        render_paired(p, _label(i), _label(0))
    if plot and png is None:
        console.print("no plot: none of these runs carries a training step")
    elif png:
        console.print(f"plot: {png}", soft_wrap=True)


def render_paired(p: cmp.Paired, b: str, a: str) -> None:
    """The paired comparison of run `b` against run `a`."""
    if not p.comparable:
        console.print(
            f"[bold yellow]{b} vs {a}: not comparable[/]: {'; '.join(p.problems)}", soft_wrap=True
        )
        return
    t = compact(
        f"{b} vs {a}: paired over {p.samples} samples "
        f"({p.confidence:.0%} bootstrap interval, {p.resamples} resamples)"
    )
    for col in ("metric", a, b, "delta", "interval", "improved", "worse"):
        t.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for d in p.deltas:
        colour = "green" if d.low > 0 else "red" if d.high < 0 else ""
        delta = f"[{colour}]{d.delta:+.3f}[/]" if colour else f"{d.delta:+.3f}"
        t.add_row(
            d.metric,
            fmt(d.mean_a),
            fmt(d.mean_b),
            delta,
            f"[{d.low:+.3f}, {d.high:+.3f}]",
            pct(d.improved),
            pct(d.worse),
        )
    console.print(t)
    if p.only_a or p.only_b:
        console.print(f"not paired: {p.only_a} samples only in {a}, {p.only_b} only in {b}")


@results_app.command("plot")
def plot_cmd(
    run_ids: RunsArgument = None,
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
) -> None:
    """(Re)draw each run's plots and the tau-per-step plot of the runs."""
    root = _root(results_dir, inventory_path)
    runs = _runs(run_ids, root)
    for r in runs:
        for p in plots.plot_run(r):
            console.print(str(p), soft_wrap=True)
    png = plots.plot_tau_by_step(runs, root / "tau_by_step.png")
    if png:
        console.print(str(png), soft_wrap=True)


@results_app.command("export")
def export_cmd(
    run_ids: RunsArgument = None,
    fmt_: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="csv | jsonl (a file), tensorboard (a log folder), "
            "wandb (PROJECT or DIR/PROJECT; offline unless WANDB_MODE=online).",
        ),
    ] = "csv",
    out: Annotated[
        Path, typer.Option("--output", "-o", help="Where to write (see --format).")
    ] = Path("-"),
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
) -> None:
    """Export runs (default: all) to CSV, JSON lines, TensorBoard or W&B.

    Trackers get tau per training step, one tracker run per training run."""
    if fmt_ not in exp.FORMATS:
        raise DflashError(f"unknown format {fmt_!r}; use one of {', '.join(exp.FORMATS)}")
    if str(out) == "-":
        raise DflashError(
            "export needs -o PATH (a file for csv/jsonl, a folder for "
            "tensorboard, a project for wandb)"
        )
    runs = _runs(run_ids, _root(results_dir, inventory_path))
    where = exp.export(runs, fmt_, out)
    console.print(f"exported {len(runs)} run(s) as {fmt_}: {where}", soft_wrap=True)
    if fmt_ == "tensorboard":
        console.print(f"view: tensorboard --logdir {where}", soft_wrap=True)


@results_app.command("report")
def report_cmd(
    run_ids: RunsArgument = None,
    out: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    title: Annotated[str, typer.Option(help="Page title.")] = "dflash results",
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
) -> None:
    """One self-contained HTML page of runs (default: all), plots inline.

    Tau by step with DDTree lines, the comparison with paired deltas against the first
    run, and per run the histogram, per-position acceptance with attempt counts,
    environment and provenance. No scripts, no external files."""
    runs = _runs(run_ids, _root(results_dir, inventory_path))
    path = rep.write_report(runs, out, title)
    console.print(f"report of {len(runs)} run(s): {path}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(results_app, name="results")
