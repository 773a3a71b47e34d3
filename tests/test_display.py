"""What dflash shows and exports, at any terminal width and for any name: tables that never
cut an id or a number, names that are text (never rich markup, never mathtext, never a
spreadsheet formula), progress that is whole lines off a terminal, result files whose
JSON types are checked before use, and a report whose baseline is the earliest step.

Run folders come from `tests.helpers.runs` (the engine's own metrics over seeded records);
the CLI runs in a child process at the width under test, as a user's would."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, one_error_line
from tests.helpers.cli import dflash as run_cli
from tests.helpers.runs import edit_result, make_run
from tests.helpers.screen import console_at

WIDTHS = (60, 80)
CUT = "…"


def dflash(*args: str, columns: int = 80, **kw) -> subprocess.CompletedProcess:
    return run_cli(*args, env={"COLUMNS": str(columns)}, **kw)


def lines_of(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


@pytest.fixture
def runs(tmp_path) -> Path:
    """A results folder of one training run, evaluated out of step order (150, then 0,
    then 300): ids as long as real ones, tau rising with the step."""
    root = tmp_path / "results"
    make_run(root, "20261201-162519-step-150-ac0f3e9b2d41", "step-150", 150, skill=0.6, created=1e9)
    make_run(root, "20261201-170102-step-0-5d1c7a9e0b33", "step-0", 0, skill=0.15, created=2e9)
    make_run(root, "20261201-173344-step-300-e4b8c2a17f60", "step-300", 300, skill=0.8, created=3e9)
    return root


@pytest.fixture
def screen():
    """Render with the CLI's own stdout console at a width, capturing what it prints."""

    def render(width: int, fn, *args) -> str:
        with console_at(width) as con, con.capture() as cap:
            fn(*args)
        return cap.get()

    return render


# ---- ids and numbers are never cut --------------------------------------------------------


@pytest.mark.parametrize("columns", WIDTHS)
def test_results_list_and_show_never_cut_ids_or_numbers(runs, columns):
    from orchestrator.results import store, summary

    proc = dflash("results", "list", "--results-dir", str(runs), columns=columns)
    assert proc.returncode == 0, proc.stderr
    assert CUT not in proc.stdout, proc.stdout
    for run in store.list_runs(runs):
        s = summary.summary(run)
        row = next(ln for ln in proc.stdout.splitlines() if ln.startswith(run.run_id))
        assert f"{s['tau_per_sample_mean']:.3f}" in row.split(), row
    one = store.list_runs(runs)[0]
    show = dflash("results", "show", one.run_id, "--results-dir", str(runs), columns=columns)
    assert show.returncode == 0, show.stderr
    assert CUT not in show.stdout and one.run_id in show.stdout, show.stdout
    # The sha256 may wrap, but every one of its characters is there, in order.
    assert one.drafter["sha256"] in re.sub(r"[\s│]", "", show.stdout)


@pytest.mark.parametrize("columns", WIDTHS)
def test_jobs_follow_and_parity_tables_never_cut_ids_or_numbers(screen, columns):
    from orchestrator.commands import output

    job_ids = ["20261201-162519-step-150-ac0f3e9b2d41", "20261201-170102-parity-5d1c7a9e0b33"]
    jobs = [
        {
            "host": "evalbox-east-2",
            "job_id": job_ids[0],
            "state": "running",
            "checkpoint": "step-150",
            "progress": {"event": "sample", "done": 17, "total": 64},
        },
        {
            "host": "evalbox-east-2",
            "job_id": job_ids[1],
            "state": "failed",
            "checkpoint": "parity",
            "exit": {"error": "ModuleNotFoundError: No module named 'torch' on this host"},
        },
    ]
    text = screen(columns, output.render_jobs, jobs)
    assert CUT not in text and all(j in text for j in job_ids), text

    history = [
        {
            "step": s,
            "checkpoint": f"step_{s}",
            "state": "done",
            "tau_per_sample_mean": 1.23456 + s / 1000,
            "tau_token_weighted": 1.5,
            "ddtree": {str(b): 2.0 + b / 100 for b in (8, 16, 32, 64)},
            "target_agreement": 0.875,
        }
        for s in (0, 1500, 3000)
    ]
    text = screen(columns, lambda: output.show(output.history_table(history)))
    assert CUT not in text, text
    shown = re.findall(r"DDTree-(\d*)", text)  # a cut header leaves no digits
    assert shown and all(b in ("8", "16", "32", "64") for b in shown), text
    for h in history:
        tau = h["tau_per_sample_mean"]
        assert re.search(rf"\b{h['step']}\s+step_{h['step']}\s+{tau:.3f}\b", text), text

    layers = [
        {
            "layer": i,
            "tokens": 96,
            "cosine": {"p50": 0.9999871, "p1": 0.9993456, "min": 0.9981234},
            "rel_l2": {"p50": 3.93e-4, "p99": 1.27e-3, "max": 4.5e-3},
            "max_abs": {"p99": 2.1e-2, "max": 8.8e-2},
        }
        for i in range(3)
    ]
    result = {"samples": 8, "layers": layers, "top1_agreement": {"match": 7, "total": 8}}
    text = screen(columns, output.render_parity, result, Path("/nonexistent"))
    assert CUT not in text, text
    for value in ("0.999987", "3.93e-04", "1.27e-03"):
        assert value in text, text


@pytest.mark.parametrize("columns", WIDTHS)
def test_help_never_cuts_an_option_name(columns):
    import typer.main

    from orchestrator.cli import app

    cmd = typer.main.get_command(app).commands["remote-eval"]
    proc = dflash("remote-eval", "--help", columns=columns)
    assert proc.returncode == 0, proc.stderr
    assert CUT not in proc.stdout, proc.stdout
    words = set(re.findall(r"--?[\w-]+", proc.stdout))
    for param in cmd.params:
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("-"):
                assert opt in words, (opt, proc.stdout)
    assert "--ground-truth-kind" in words


# ---- names are text -------------------------------------------------------------------


def test_names_are_text_never_markup_and_control_characters_show(screen, tmp_path):
    from orchestrator.commands import output
    from orchestrator.results import store

    root = tmp_path / "results"
    make_run(root, "run-glob", "step_109*glob?[a]", 109)
    make_run(root, "run-newline", "step_110\nsecond line", 110)
    text = screen(80, output.render_summary, store.load_run(root / "run-glob"))
    assert "step_109*glob?[a]" in text, text
    text = screen(80, output.render_summary, store.load_run(root / "run-newline"))
    assert "step_110\\nsecond line" in text, text
    # The one line of an error keeps a name's brackets and shows its line break.
    rendered = screen(80, lambda: output.console.print(output.error_line("no run 'a[b]\nc'")))
    assert lines_of(rendered) == ["error: no run 'a[b]\\nc'"]


def test_a_probe_tree_shows_a_hosts_names_as_text(screen, tmp_path):
    """The tree of a real probe of a real checkpoint, in a folder named like markup."""
    from orchestrator.commands import output
    from orchestrator.demo.architectures import save_tiny
    from remote.probe.structure import probe

    folder = save_tiny("qwen3", tmp_path / "step_109[a][/]" / "ckpt[bold]x")
    text = screen(200, output.render_probe, probe(str(folder), depth=1), "evalbox[b]")
    assert f"{folder} on evalbox[b]" in text, text


def test_a_lone_surrogate_in_a_name_is_shown_everywhere(tmp_path):
    root = tmp_path / "results"
    make_run(root, "run-bytes", "step_7_\udcff\udcfe", 7)
    make_run(root, "run-ok", "step_8", 8, created=2e9)
    for args in (
        ("results", "list"),
        ("results", "show", "run-bytes"),
        ("results", "export", "-f", "csv"),
        ("results", "export", "-f", "jsonl"),
        ("results", "report", "-o", str(tmp_path / "r.html")),
        ("results", "plot"),
    ):
        proc = dflash(*args, "--results-dir", str(root))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert (
        "step_7_\\udcff\\udcfe"
        in dflash("results", "show", "run-bytes", "--results-dir", str(root)).stdout
    )
    assert "step_7_\\udcff\\udcfe" in (tmp_path / "r.html").read_text()


def test_a_dollar_pair_in_a_name_is_drawn_as_text_not_mathtext(tmp_path):
    root = tmp_path / "results"
    make_run(root, "run-dollar", "step_960_$RUN_$SEED", 960)
    plot = dflash("results", "plot", "--results-dir", str(root))
    assert plot.returncode == 0, plot.stderr
    assert (root / "run-dollar" / "acceptance_histogram.png").is_file()
    report = dflash("results", "report", "-o", str(tmp_path / "r.html"), "--results-dir", str(root))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.html").read_text()
    assert "step_960_$RUN_$SEED" in page and "plot failed" not in page


def test_one_runs_failing_plot_never_breaks_the_folders_report_or_plots(tmp_path):
    root = tmp_path / "results"
    make_run(root, "run-good", "step-10", 10)
    bad = make_run(root, "run-unplottable", "step-20", 20, created=2e9)
    # Valid types (a position may be unknown), but not something the plot can place.
    edit_result(bad, lambda d: d["metrics"]["per_position_acceptance"][0].update(position=None))
    report = dflash("results", "report", "-o", str(tmp_path / "r.html"), "--results-dir", str(root))
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    assert "plot failed" in report.stdout and "run-unplottable" in report.stdout
    assert 'data-plot="acceptance_histogram0"' in (tmp_path / "r.html").read_text()
    plot = dflash("results", "plot", "--results-dir", str(root))
    assert plot.returncode == 1 and "Traceback" not in plot.stderr, plot.stderr
    assert (root / "run-good" / "per_position_acceptance.png").is_file()
    assert one_error_line(plot).startswith("plot failed: run-unplottable: ")


# ---- exports ----------------------------------------------------------------------------


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised(tmp_path):
    from orchestrator.results.export import csv_cell

    root = tmp_path / "results"
    hostile = ["=cmd|' /C calc'!A0", '=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)"]
    for i, name in enumerate(hostile):
        make_run(root, f"run-{i}", name, i, created=1e9 + i, host="\tevalbox")
    proc = dflash("results", "export", "-f", "csv", "--results-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert sorted(r["checkpoint"] for r in rows) == sorted("'" + n for n in hostile)
    assert {r["host"] for r in rows} == {"'\\tevalbox"}
    assert all(re.fullmatch(r"\d\.\d+", r["tau_per_sample_mean"]) for r in rows)  # numbers
    assert csv_cell(-0.905) == -0.905 and csv_cell("-0.905") == "-0.905"
    assert csv_cell("\rx") == "'\\rx" and csv_cell("step-1") == "step-1"


def test_export_writes_csv_to_stdout_by_default_and_trackers_need_a_place(runs):
    proc = dflash("results", "export", "--results-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(rows) == 3 and {"run_id", "tau_per_sample_mean", "step"} <= set(rows[0])
    jl = dflash("results", "export", "-f", "jsonl", "-o", "-", "--results-dir", str(runs))
    assert [json.loads(ln)["step"] for ln in jl.stdout.splitlines()] == [150, 0, 300]
    tb = dflash("results", "export", "-f", "tensorboard", "--results-dir", str(runs))
    assert tb.returncode != 0
    assert one_error_line(tb).startswith("error: tensorboard export needs -o: a log folder")


# ---- result files: their JSON types are checked --------------------------------------------


@pytest.mark.parametrize(
    "field,change",
    [
        ("metrics.tau_per_sample_mean", lambda d: d["metrics"].update(tau_per_sample_mean="x")),
        (
            "metrics.acceptance_histogram.2",
            lambda d: d["metrics"]["acceptance_histogram"].update({"2": "x"}),
        ),
        (
            "metrics.ddtree.4.tau_per_sample_mean",
            lambda d: d["metrics"]["ddtree"]["4"].update(tau_per_sample_mean=[1]),
        ),
        (
            "inputs.drafter_identity.step",
            lambda d: d["inputs"]["drafter_identity"].update(step="150"),
        ),
    ],
)
def test_a_result_with_wrong_types_is_one_line_and_never_hides_the_others(
    runs, tmp_path, field, change
):
    bad = make_run(runs, "20261201-180000-step-450-badbadbadbad", "step-450", 450, created=4e9)
    edit_result(bad, change)
    listed = dflash("results", "list", "--results-dir", str(runs))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert listed.stdout.count("20261201-") == 3 and bad.name not in listed.stdout
    (line,) = lines_of(listed.stderr)
    assert line.startswith(f"skipped: run {bad.name}: result.json: {field} is "), line
    report = dflash("results", "report", "-o", str(tmp_path / "r.html"), "--results-dir", str(runs))
    assert report.returncode == 0 and f"run {bad.name}: result.json: {field}" in report.stderr
    tb = dflash(
        "results",
        "export",
        "-f",
        "tensorboard",
        "-o",
        str(tmp_path / "tb"),
        "--results-dir",
        str(runs),
    )
    assert tb.returncode == 0 and "Traceback" not in tb.stderr, tb.stderr
    show = dflash("results", "show", bad.name, "--results-dir", str(runs))
    assert show.returncode != 0
    assert f"error: run {bad.name}: result.json: {field} is " in one_error_line(show)


def test_pulled_result_files_are_checked_before_they_land(tmp_path):
    import base64

    from orchestrator.eval import pull
    from orchestrator.inventory import parse_inventory
    from orchestrator.transport.hosts import open_host
    from remote.protocol import check_files

    folder = make_run(tmp_path, "job-1", "step-1", 1)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    check_files(files)  # a result as the engine writes it passes
    inv = parse_inventory("hosts: {evalbox: {transport: local}}\n", tmp_path / "inv.yaml")
    host = open_host(inv.host("evalbox"), inv)
    doc = json.loads(files["result.json"])
    doc["metrics"]["samples"] = "four"
    files["result.json"] = json.dumps(doc).encode()
    encoded = {k: base64.b64encode(v).decode() for k, v in files.items()}
    from orchestrator.errors import DflashError

    with pytest.raises(DflashError) as info:
        pull.decode_files(host, "job-1", encoded)
    assert str(info.value) == (
        'evalbox: job job-1: result.json: metrics.samples is "four" (a string), expected an '
        "integer; nothing was pulled"
    )
    spec = json.loads(files["spec.json"])
    spec["created"] = "yesterday"
    encoded["result.json"] = base64.b64encode(folder.joinpath("result.json").read_bytes()).decode()
    encoded["spec.json"] = base64.b64encode(json.dumps(spec).encode()).decode()
    with pytest.raises(DflashError, match=r"spec.json: created is \"yesterday\""):
        pull.decode_files(host, "job-1", encoded)


# ---- the report's baseline ----------------------------------------------------------------


def test_report_compares_each_run_with_the_earliest_step_of_its_series(runs, tmp_path):
    from orchestrator.results import store

    by_step = {r.step: r.run_id for r in store.list_runs(runs)}
    page = tmp_path / "r.html"
    proc = dflash("results", "report", "-o", str(page), "--results-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    assert f"baseline: {by_step[0]} (step 0), the earliest training step of" in proc.stdout
    html = page.read_text()
    assert f"baseline: {by_step[0]} (step 0)" in html
    rows = re.findall(r'<tr><td class="l"><span class="mono">([^<]+)</span>(.*?)</tr>', html)
    cells = {run_id: rest for run_id, rest in rows}
    assert ">baseline<" in cells[by_step[0]]
    for step in (150, 300):  # tau rises with the step: both above the baseline, in green
        assert re.search(r'<span class="up">\+\d\.\d{3}</span>', cells[by_step[step]]), cells
    assert 'class="down"' not in html
    named = dflash(
        "results", "report", "-o", str(page), "--baseline", by_step[300], "--results-dir", str(runs)
    )
    assert named.returncode == 0, named.stderr
    assert f"baseline: {by_step[300]} (step 300), named by --baseline" in named.stdout
    rows = re.findall(
        r'<tr><td class="l"><span class="mono">([^<]+)</span>(.*?)</tr>', page.read_text()
    )
    cells = {run_id: rest for run_id, rest in rows}
    assert ">baseline<" in cells[by_step[300]]
    for step in (0, 150):  # below the named baseline, in red (so are their context buckets)
        assert re.search(r'<span class="down">-\d\.\d{3}</span>', cells[by_step[step]]), cells
    assert "--baseline" in dflash("results", "report", "--help").stdout


# ---- relay: one word per thing; no empty table -----------------------------------------------


@pytest.fixture
def local_relay(tmp_path) -> Path:
    """A local trainer with a complete checkpoint, an incomplete one and one whose name is
    full of markup and glob characters; a local eval host."""
    ckpts, drafters = tmp_path / "ckpts", tmp_path / "drafters"
    for name, complete in (("step_100", True), ("step_200", False), ("step_300[a]*?", True)):
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "config.json").write_text("{}")
        (ckpts / name / "model.safetensors").write_bytes(bytes(range(256)) * 8)
        if complete:
            (ckpts / name / "COMPLETE").write_text("")
    drafters.mkdir()
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "hosts:\n"
        f"  trainer: {{transport: local, roles: {{trainer: {{checkpoints: {ckpts}, "
        "complete_rule: marker}}}\n"
        f"  evalbox: {{transport: local, roles: {{eval: {{drafters: {drafters}}}}}}}\n"
        "defaults: {relay_from: trainer, relay_to: evalbox}\n"
    )
    return inv


def test_relay_says_not_complete_and_already_there_and_never_skipped(local_relay):
    listing = dflash("relay", "--list", "-i", str(local_relay))
    assert listing.returncode == 0, listing.stderr
    assert "step_300[a]*?" in listing.stdout
    first = dflash("relay", "--all", "-i", str(local_relay))
    assert first.returncode == 0, first.stderr
    again = dflash("relay", "--all", "-i", str(local_relay))
    assert again.returncode == 0, again.stderr
    for out in (first.stdout, again.stdout):
        assert "skipped" not in out, out
        assert "not complete, left out: step_200: " in out, out
        assert re.search(r"^checkpoint\s+step .* already there$", out, re.M), out
    assert "step_300[a]*?" in again.stdout and "unchanged" in again.stdout


def test_relay_of_a_step_not_complete_prints_only_its_error(local_relay):
    proc = dflash("relay", "--step", "200", "-i", str(local_relay))
    assert proc.returncode == 1
    assert proc.stdout == "", proc.stdout
    assert one_error_line(proc) == "error: step_200 was not relayed: no COMPLETE marker yet"


# ---- progress off a terminal --------------------------------------------------------------


def test_progress_off_a_terminal_is_whole_lines_never_one_endless_line():
    """Every progress view, driven as the library drives it, with stderr a pipe."""
    script = r"""
from types import SimpleNamespace as NS
from orchestrator.commands import output

with output.ParityLines() as lines:
    for stage, host in (("capture evalbox", "evalbox"), ("capture trainer", "trainer")):
        lines.started(stage, NS(job_id="j-" + host, host=host))
        for i in range(1, 9):
            lines(stage, {"event": "sample", "done": i, "total": 8})
with output.LiveProgress() as live:
    live({"event": "phase", "phase": "ground_truth", "source": "sglang[x]"})
    live({"event": "ground_truth", "done": 8, "total": 8})
    for i in range(1, 9):
        ev = {"event": "sample", "done": i, "total": 8, "tokens": 4, "time": i}
        live({**ev, "tau_per_sample_mean": 2.5})
with output.ShardProgress() as shards:
    shards.set_total(8)
    for host in ("east[b]", "west"):
        shards(host, {"event": "shard", "samples": 4})
        for i in range(4):
            shards(host, {"event": "sample", "tokens": 3, "tau_per_sample_mean": 2.0, "time": i})
bar = output.RelayProgress()
bar.start(4096, 2)
for _ in range(2):
    bar.advance(2048)
    bar.file_done("step_1", "model.safetensors")
bar.stop()
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "80"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\r" not in err and "\x1b" not in err, repr(err)
    assert err.endswith("\n")
    assert max(len(ln) for ln in err.splitlines()) <= 80, err
    assert "capture evalbox: job j-evalbox on evalbox" in err
    assert re.search(r"capture trainer .* 8/8", err), err
    assert "ground truth (sglang[x])" in err and "east[b]" in err
    assert "tau 2.500" in err and "tau 2.000" in err  # the events' running headline
