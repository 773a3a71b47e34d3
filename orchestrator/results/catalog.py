"""The results folder as `dflash results` sees it: one call per subcommand."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.inventory import InventoryError, load_inventory
from orchestrator.results import compare as cmp
from orchestrator.results import store as res
from orchestrator.results import summary, sweep
from orchestrator.results.gate import Gate, GateOptions, gate


def results_root(results_dir: Path | None, inventory_path: Path | None) -> Path:
    """`results_dir`, else the inventory's, else ``./results`` when no inventory was named."""
    if results_dir:
        return results_dir
    try:
        return res.results_dir(load_inventory(inventory_path))
    except InventoryError:
        if inventory_path:
            raise
        return Path("results")


@dataclass
class Selected:
    """The runs a command works on, and a line for each unreadable run folder left out."""

    runs: list[res.Run]
    skipped: list[str]


def select_runs(run_ids: list[str] | None, root: Path) -> Selected:
    """The named runs (each must read), else every readable run of `root`; none is an error."""
    if run_ids:
        selected = Selected([res.load_run(r, root) for r in run_ids], [])
    else:
        selected = Selected(*res.scan_runs(root))
    if not selected.runs:
        more = (
            f"; {len(selected.skipped)} unreadable: {selected.skipped[0]}"
            if selected.skipped
            else ""
        )
        raise DflashError(
            f"no runs in {root} (pull one with dflash remote-eval, or pass --results-dir){more}"
        )
    return selected


@dataclass
class Listing:
    """Every run in a results folder: eval runs oldest first, and parity runs."""

    root: Path
    runs: list[res.Run]
    parity_runs: list[tuple[Path, dict]]
    skipped: list[str]
    sweeps: list[sweep.Sweep] = field(default_factory=list)

    def to_json(self) -> list[dict]:
        from orchestrator.results import parity_view

        return (
            [summary.summary(r) for r in self.runs]
            + [parity_view.summary(r, p.name) for p, r in self.parity_runs]
            + [{"kind": "sweep", **sweep.to_json(s)} for s in self.sweeps]
        )


def list_all(results_dir: Path | None, inventory_path: Path | None) -> Listing:
    """The runs of the results folder (see `results_root`)."""
    from orchestrator.results import parity_view

    root = results_root(results_dir, inventory_path)
    runs, skipped = res.scan_runs(root)
    return Listing(root, runs, parity_view.list_runs(root), skipped, sweep.list_sweeps(root))


@dataclass
class ParityRun:
    """A parity run found by `find`: its folder and its result."""

    path: Path
    result: dict


def find(
    run_id: str, results_dir: Path | None, inventory_path: Path | None
) -> res.Run | ParityRun | sweep.Sweep:
    """One run by folder, id, unique prefix or unique part, among every kind the results
    folder holds: a sweep, a parity run, else an eval run."""
    from orchestrator.results import parity_view

    root = results_root(results_dir, inventory_path)
    folder = Path(run_id)
    if not _is_run(folder):
        folder = res.find_folder(run_id, root, lambda p: not p.name.startswith(".") and _is_run(p))
    if sweep.is_sweep(folder):
        return sweep.load(folder)
    if parity_view.is_parity_run(folder):
        return ParityRun(folder, parity_view.load(folder))
    return res.load_run(folder)


def _is_run(folder: Path) -> bool:
    """Whether `folder` is a run of any kind `find` shows."""
    return sweep.is_sweep(folder) or (folder / "result.json").is_file()


@dataclass
class Comparison:
    """Runs side by side (`summary.compare_rows`) and each paired against the first."""

    runs: list[res.Run]
    rows: list[dict]
    paired: list[cmp.Paired]
    plot_asked: bool
    plot: Path | None
    gate: Gate | None = None

    def to_json(self) -> dict:
        return {
            "runs": [r.run_id for r in self.runs],
            "rows": [
                {"metric": r["name"], "label": r["label"], "values": r["values"]} for r in self.rows
            ],
            "paired": [p.to_json() for p in self.paired],
            "plot": str(self.plot) if self.plot else None,
            "gate": self.gate.to_json() if self.gate else None,
        }


def compare(
    run_ids: list[str],
    results_dir: Path | None,
    inventory_path: Path | None,
    plot: Path | None = None,
    resamples: int = cmp.RESAMPLES,
    seed: int = 0,
    allow_different_prompting: bool = False,
    gate_options: GateOptions | None = None,
) -> Comparison:
    """Compare two or more runs against the first, maybe plotted and gated; a run prompted
    otherwise is refused unless `allow_different_prompting` (docs/results.md)."""
    if len(run_ids) < 2:
        raise DflashError("compare needs at least two runs")
    root = results_root(results_dir, inventory_path)
    runs = [res.load_run(r, root) for r in run_ids]
    for r in runs[1:]:
        problems = [] if allow_different_prompting else cmp.prompting_problems(runs[0], r)
        if problems:
            raise DflashError(
                f"{r.run_id} vs {runs[0].run_id}: {'; '.join(problems)}: no delta between "
                "runs that put their prompts to the target differently (tau moves with it); "
                "compare runs of one mode, or pass --allow-different-prompting"
            )
    rows = summary.compare_rows(runs)
    pairs = [
        cmp.paired(
            runs[0],
            r,
            resamples=resamples,
            seed=seed,
            allow_different_prompting=allow_different_prompting,
        )
        for r in runs[1:]
    ]
    png = None
    if plot:
        from orchestrator.results import plots

        png = plots.plot_tau_by_step(runs, plot)
    verdict = gate(pairs, gate_options) if gate_options is not None else None
    return Comparison(runs, rows, pairs, plot is not None, png, verdict)


@dataclass
class Drawn:
    """What `draw_plots` wrote, the plots that failed and the folders it could not read."""

    paths: list[Path]
    failed: list[str]
    skipped: list[str]


def draw_plots(
    run_ids: list[str] | None, results_dir: Path | None, inventory_path: Path | None
) -> Drawn:
    """(Re)draw each run's plots and the tau-per-step plot; a failed plot never stops others."""
    from orchestrator.results import plots

    root = results_root(results_dir, inventory_path)
    selected = select_runs(run_ids, root)
    drawn: list[Path] = []
    failed: list[str] = []
    for r in selected.runs:
        try:
            drawn += plots.plot_run(r)
        except Exception as exc:
            failed.append(f"{r.run_id}: {type(exc).__name__}: {exc}")
    try:
        png = plots.plot_tau_by_step(selected.runs, root / "tau_by_step.png")
    except Exception as exc:
        failed.append(f"tau_by_step.png: {type(exc).__name__}: {exc}")
        png = None
    return Drawn(drawn + ([png] if png else []), failed, selected.skipped)


@dataclass
class Written:
    """What an export or report wrote: runs, format, where (or stdout's `text`), notes."""

    runs: int
    format: str
    path: Path | None
    text: str | None = None
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


STDOUT = Path("-")


def export(
    run_ids: list[str] | None,
    fmt: str,
    out: Path,
    results_dir: Path | None,
    inventory_path: Path | None,
) -> Written:
    """Export the runs (default all) in `fmt` to `out` (``-``: the text returned for stdout);
    a bad format or place is refused before any run is read."""
    from orchestrator.results import export as exp

    if fmt not in exp.FORMATS:
        raise DflashError(f"unknown format {fmt!r}; use one of {', '.join(exp.FORMATS)}")
    if out == STDOUT and fmt not in exp.TEXT_FORMATS:
        where = "a log folder" if fmt == "tensorboard" else "a project (PROJECT or DIR/PROJECT)"
        raise DflashError(f"{fmt} export needs -o: {where}; only csv and jsonl go to stdout")
    selected = select_runs(run_ids, results_root(results_dir, inventory_path))
    if out == STDOUT:
        text = exp.render_text(selected.runs, fmt)
        return Written(len(selected.runs), fmt, None, text=text, skipped=selected.skipped)
    path = exp.export(selected.runs, fmt, out)
    return Written(len(selected.runs), fmt, path, skipped=selected.skipped)


def report(
    run_ids: list[str] | None,
    out: Path,
    title: str,
    results_dir: Path | None,
    inventory_path: Path | None,
    baseline: str | None = None,
) -> Written:
    """Write the HTML report of the runs (default all) to `out`, against `baseline` if named."""
    from orchestrator.results import report as rep

    root = results_root(results_dir, inventory_path)
    selected = select_runs(run_ids, root)
    base = res.load_run(baseline, root) if baseline else None
    page = rep.write_report(
        selected.runs, out, title, baseline=base, sweeps=sweep.list_sweeps(root)
    )
    return Written(
        len(selected.runs), "html", page.path, skipped=selected.skipped, notes=page.notes
    )
