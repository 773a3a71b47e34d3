"""`dflash results list | show | compare | plot | export | report`: each a call into
`orchestrator.results.catalog`, shown through `orchestrator.commands.output`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.commands.common import InventoryOption, JsonOption
from orchestrator.results import catalog
from orchestrator.results.compare import RESAMPLES
from orchestrator.results.gate import gate_request

results_app = typer.Typer(
    help="Read pulled eval results: list, show, compare, plot, export, report.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help, as the root's (orchestrator.cli): never cut
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


@results_app.command("list")
def list_cmd(
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Every run (and temperature sweep) in the results folder, oldest first, by its full id.

    show and compare take that id, or a unique prefix of it."""
    listing = catalog.list_all(results_dir, inventory_path)
    output.emit(listing, json_out, human=output.render_listing, as_json=catalog.Listing.to_json)
    output.render_skipped(listing.skipped)  # on stderr, with or without --json


@results_app.command("show")
def show_cmd(
    run_id: Annotated[str, typer.Argument(help="Run id (or unique part), sweep id or folder.")],
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """One run in full: tau, DDTree budgets, histogram, per-position acceptance, target
    agreement, timings, environment.

    When the results folder holds another run of the same checkpoint, one line says how
    their settings differ (samples, prompts, max tokens, dtype, ground truth, budgets,
    thinking, positions, target), or that they match."""
    found = catalog.find(run_id, results_dir, inventory_path)
    output.emit(found, json_out, human=output.render_found, as_json=output.found_json)


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
    ] = RESAMPLES,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    allow_different_prompting: Annotated[
        bool,
        typer.Option(
            "--allow-different-prompting",
            help="Pair runs whose thinking mode or chat template differ (refused otherwise).",
        ),
    ] = False,
    fail_below: Annotated[
        float | None,
        typer.Option(
            "--fail-below",
            help="CI gate: exit 1 when a run's tau is below this fraction of the first's "
            "(0.95: under 95%), paired sample by sample.",
            show_default=False,
        ),
    ] = None,
    fail_if_worse: Annotated[
        bool,
        typer.Option(
            "--fail-if-worse",
            help="CI gate: exit 1 when a run's paired interval of tau minus the first's "
            "lies wholly below 0 (a drop beyond noise).",
        ),
    ] = False,
    gate_metric: Annotated[
        str | None,
        typer.Option(
            "--gate-metric",
            help="The metric the gate checks (default tau_per_sample_mean).",
            show_default=False,
        ),
    ] = None,
    gate_by: Annotated[
        list[str] | None,
        typer.Option(
            "--gate-by",
            help="Also gate each group of: category, subcategory, completion_length, context "
            "(each context bucket's paired tau; repeatable).",
            show_default=False,
        ),
    ] = None,
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Runs side by side, and each against the first, paired sample by sample.

    Reports the mean delta tau with a bootstrap 95% interval and the share of samples that
    improved, over all samples and per category and completion length. Runs over different
    prompts, ground truth, target or dtype are reported as not comparable; runs with
    another thinking mode or chat template are refused (exit 1). With --fail-below or
    --fail-if-worse it is a CI gate: one line says pass (exit 0) or which metric and group
    failed and by how much (exit 1); docs/results.md."""
    gate_options = gate_request(fail_below, fail_if_worse, gate_metric, gate_by)
    comparison = catalog.compare(
        run_ids,
        results_dir,
        inventory_path,
        plot=plot,
        resamples=resamples,
        seed=seed,
        allow_different_prompting=allow_different_prompting,
        gate_options=gate_options,
    )
    output.emit(
        comparison, json_out, human=output.render_comparison, as_json=catalog.Comparison.to_json
    )
    output.gate_exit(comparison)


@results_app.command("plot")
def plot_cmd(
    run_ids: RunsArgument = None,
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
) -> None:
    """(Re)draw each run's plots and the tau-per-step plot of the runs."""
    output.render_paths(catalog.draw_plots(run_ids, results_dir, inventory_path))


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
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Where to write (see --format); '-' is stdout (csv and jsonl only).",
        ),
    ] = catalog.STDOUT,
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
) -> None:
    """Export runs (default: all) to CSV, JSON lines, TensorBoard or W&B.

    CSV and JSON lines go to stdout unless -o names a file. In CSV, a text cell that a
    spreadsheet would run as a formula (starting with = + - @) is prefixed with a '.
    Trackers get tau per training step, one tracker run per training run."""
    written = catalog.export(run_ids, fmt_, out, results_dir, inventory_path)
    output.render_export(written)


@results_app.command("report")
def report_cmd(
    run_ids: RunsArgument = None,
    out: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    title: Annotated[str, typer.Option(help="Page title.")] = "dflash results",
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Compare every run with this one (id, unique prefix or folder) "
            "(default: the earliest training step of each run's series).",
            show_default=False,
        ),
    ] = None,
    results_dir: ResultsDirOption = None,
    inventory_path: InventoryOption = None,
) -> None:
    """One self-contained HTML page of runs (default: all), plots inline.

    Tau by step with DDTree lines, the comparison with paired deltas, and per run the
    histogram, per-position acceptance with attempt counts, environment and provenance.
    Each run is compared with its baseline: the earliest training step of its series
    (same training run, prompts and ground truth), or the run --baseline names; the page
    says which. No scripts, no external files."""
    written = catalog.report(run_ids, out, title, results_dir, inventory_path, baseline)
    output.render_report(written)


def register(app: typer.Typer) -> None:
    app.add_typer(results_app, name="results")
