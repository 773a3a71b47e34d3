"""The metric registry (`remote.protocol.metrics`) is the one place a metric is defined:
an entry added there reaches the engine's summary, the result schema and every view
(show, list, compare with its paired delta, breakdown, CSV, trackers, the HTML report),
under its one name. Run folders come from `tests.helpers.runs`, summarised by the
engine's own `summarize` with the entry registered, as a host's would be."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from orchestrator.results import catalog, export, report, summary
from orchestrator.results import store as res
from remote.eval.metrics import round_starts, summarize
from remote.protocol import ResultError, check_result
from remote.protocol import metrics as registry
from remote.protocol.metrics import Finding, Keyed, Metric
from tests.helpers.runs import make_run
from tests.helpers.screen import console_at

NAME = "first_round_length"
LABEL = "acceptance length of the first round"


@pytest.fixture
def first_round():
    """A per-sample metric added to the registry for the test, as a contributor would:
    the mean over samples of the first round's acceptance length."""
    m = Metric(
        name=NAME,
        label=LABEL,
        header="first",
        definition="the first round's acceptance length, averaged over samples",
        parts=lambda rounds: (rounds[0], 1) if rounds else None,
        rank=4,
        interval=True,
    )
    registry.METRICS.append(m)
    yield m
    registry.METRICS.remove(m)


@pytest.fixture
def screen():
    """Render with the CLI's own stdout console, wide, capturing what it prints."""

    def render(fn, *args) -> str:
        with console_at(250) as con, con.capture() as cap:
            fn(*args)
        return cap.get()

    return render


def first_rounds(run: res.Run) -> float:
    recs = res.records(run)
    return sum(r["rounds"][0] for r in recs) / len(recs)


@pytest.fixture
def runs(tmp_path, first_round):
    root = tmp_path / "results"
    cats = ("qa", "math")
    make_run(root, "run-a", "step-100", 100, skill=0.2, created=1e9, samples=6, categories=cats)
    make_run(root, "run-b", "step-200", 200, skill=0.7, created=2e9, samples=6, categories=cats)
    return root


def test_a_registered_metric_is_summarised_and_typed_by_the_contract(runs):
    run = res.load_run(runs / "run-b")
    want = first_rounds(run)
    assert run.metrics[NAME] == pytest.approx(want)
    assert run.metrics["ddtree"]["2"][NAME] is not None  # a walk metric, per budget too
    doc = json.loads((runs / "run-b" / "result.json").read_text())
    doc["metrics"][NAME] = "fast"
    with pytest.raises(ResultError, match=rf"metrics\.{NAME} is .fast"):
        check_result(doc)


def test_a_registered_metric_appears_in_show_list_compare_csv_and_the_report(
    runs, screen, tmp_path
):
    from orchestrator.commands import output

    a, b = res.load_run(runs / "run-a"), res.load_run(runs / "run-b")
    want_a, want_b = f"{first_rounds(a):.3f}", f"{first_rounds(b):.3f}"
    assert want_a != want_b

    shown = screen(output.render_run, b)
    row = next(ln for ln in shown.splitlines() if LABEL in ln)
    low, high = map(float, re.search(rf"{want_b} \[(\d\.\d+), (\d\.\d+)\]", row).groups())
    assert low <= first_rounds(b) <= high and low < high, row  # its bootstrap interval
    by_group = [ln for ln in shown.splitlines() if re.match(r"\W*(qa|math)\b", ln)]
    assert by_group and all(re.search(r"\d\.\d{3}", ln) for ln in by_group)

    listed = screen(output.render_listing, catalog.list_all(runs, None))
    assert "first" in next(ln for ln in listed.splitlines() if "first" in ln).split()
    assert want_b in next(ln for ln in listed.splitlines() if ln.startswith("run-b"))

    c = catalog.compare(["run-a", "run-b"], runs, None)
    compared = screen(output.render_comparison, c)
    row = next(ln for ln in compared.splitlines() if LABEL in ln)
    assert want_a in row and want_b in row, compared
    (p,) = c.to_json()["paired"]
    delta = next(d for d in p["deltas"] if d["metric"] == NAME)
    assert delta["delta"] == pytest.approx(first_rounds(b) - first_rounds(a))
    assert any(r["metric"] == NAME for r in c.to_json()["rows"])

    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(export.render_csv([a, b])))}
    assert float(rows["run-b"][NAME]) == pytest.approx(first_rounds(b))
    assert f"{float(rows['run-b'][f'{NAME}_low']):.3f}" == f"{low:.3f}"
    assert float(rows["run-b"][f"{NAME}_high"]) == pytest.approx(high, abs=5e-4)
    qa = [r for r in res.records(b) if r["category"] == "qa"]
    got = float(rows["run-b"][f"{NAME}_category_qa"])
    assert got == pytest.approx(sum(r["rounds"][0] for r in qa) / len(qa))
    assert export.scalars(b)[NAME] == pytest.approx(first_rounds(b))

    page, _notes = report.render([a, b])
    assert ">first</th>" in page and want_b in page
    assert page.count(">first</th>") >= 3  # the comparison, and each run's categories


def test_a_metric_left_out_of_tables_still_reaches_show_compare_and_csv(tmp_path, screen):
    """A metric without a table column (`rank` None) is still in show, compare and CSV."""
    m = Metric(
        name="longest_round",
        label="longest round",
        header="longest",
        definition="the longest round",
        parts=lambda rounds: (max(rounds), 1) if rounds else None,
    )
    registry.METRICS.append(m)
    try:
        make_run(tmp_path, "r1", "step-1", 1)
        make_run(tmp_path, "r2", "step-2", 2, skill=0.8)
        run = res.load_run(tmp_path / "r2")
        want = sum(max(r["rounds"]) for r in res.records(run)) / len(res.records(run))
        rows = {r["name"]: r["values"] for r in summary.compare_rows([run])}
        assert rows["longest_round"] == [pytest.approx(want)]
        assert "longest" not in [m.header for m in summary.columns()]
        row = next(csv.DictReader(io.StringIO(export.render_csv([run]))))
        assert float(row["longest_round"]) == pytest.approx(want)
        from orchestrator.commands import output

        shown = screen(output.render_summary, run)
        assert f"{want:.3f}" in next(ln for ln in shown.splitlines() if "longest round" in ln)
    finally:
        registry.METRICS.remove(m)


def test_a_per_key_metric_reaches_show_compare_csv_plots_and_the_report(tmp_path, screen):
    """A `Keyed` entry (tau per round-start bucket, as #51's context buckets would be):
    one table in show and the report, rows in compare, columns in CSV, one figure."""
    from orchestrator.commands import output
    from orchestrator.results import plots

    def parts(rec, block):
        out = {}
        starts = round_starts(rec["prompt_tokens"], rec["rounds"])
        for start, n in zip(starts, rec["rounds"], strict=True):
            key = 1 if start < rec["prompt_tokens"] + 8 else 2
            tokens, rounds = out.get(key, (0, 0))
            out[key] = (tokens + n, rounds + 1)
        return out

    m = Keyed(
        name="tau_by_start",
        label="tau by where a round starts",
        definition="tokens over rounds of the rounds starting in each bucket",
        parts=parts,
        keys=lambda block: range(1, 3),
        reduce=registry.RATIO,
        key_name="bucket",
        num_name="tokens",
        den_name="rounds",
        header="tau from bucket",
        style="number",
    )
    registry.METRICS.append(m)
    try:
        make_run(tmp_path, "r1", "step-1", 1, skill=0.3)
        make_run(tmp_path, "r2", "step-2", 2, skill=0.8)
        run = res.load_run(tmp_path / "r2")
        early = [p.get(1, (0, 0)) for p in (parts(r, 4) for r in res.records(run))]
        want = f"{sum(t for t, _ in early) / sum(n for _, n in early):.3f}"
        assert run.metrics["tau_by_start"][0]["bucket"] == 1
        shown = screen(output.render_run, run)
        assert "tau by where a round starts" in shown
        assert re.search(rf"^\W*1\W+\d+\W+\d+\W+{want}\W*$", shown, re.M), shown
        c = catalog.compare(["r1", "r2"], tmp_path, None)
        row = next(r for r in c.rows if r["name"] == "tau_by_start_1")
        assert row["label"] == "tau from bucket 1" and f"{row['values'][1]:.3f}" == want
        csv_row = next(csv.DictReader(io.StringIO(export.render_csv([run]))))
        assert f"{float(csv_row['tau_by_start_1']):.3f}" == want
        assert export.scalars(run)["tau_by_start/1"] == pytest.approx(float(want), abs=5e-4)
        page, _ = report.render([run])
        assert "<h3>tau by where a round starts</h3>" in page
        assert 'data-plot="tau_by_start0"' in page
        assert tmp_path / "r2" / "tau_by_start.png" in plots.plot_run(run)
    finally:
        registry.METRICS.remove(m)


def test_a_finding_is_judged_with_the_metrics_and_shown_by_every_view(tmp_path, screen):
    """A `Finding` entry (one line over the samples, as #51's cliff finder would be):
    judged where the metrics are summed, stored in result.json, in every view."""
    from orchestrator.commands import output

    def lowest(records, metrics):
        worst = min(records, key=lambda r: sum(r["rounds"]) / len(r["rounds"]))
        if worst["tau"] >= metrics["tau_per_sample_mean"]:
            return None
        return f"sample {worst['id']} is the lowest, tau {worst['tau']:.3f}"

    f = Finding("lowest_sample", "lowest sample", "the sample with the lowest tau", lowest)
    registry.METRICS.append(f)
    try:
        make_run(tmp_path, "r1", "step-1", 1, skill=0.3, samples=6)
        make_run(tmp_path, "r2", "step-2", 2, skill=0.8, samples=6)
        run = res.load_run(tmp_path / "r2")  # its result.json passed the schema's check
        recs = res.records(run)
        worst = min(recs, key=lambda r: r["tau"])
        line = f"sample {worst['id']} is the lowest, tau {worst['tau']:.3f}"
        assert run.metrics["lowest_sample"] == line
        shown = " ".join(screen(output.render_run, run).replace("│", " ").split())
        assert f"lowest sample {line}" in shown
        c = catalog.compare(["r1", "r2"], tmp_path, None)
        assert next(r for r in c.rows if r["name"] == "lowest_sample")["values"][1] == line
        assert next(csv.DictReader(io.StringIO(export.render_csv([run]))))["lowest_sample"] == line
        assert f"lowest sample: {line}</p>" in report.render([run])[0]
    finally:
        registry.METRICS.remove(f)


def test_the_registry_sums_as_the_engine_always_did():
    """tau both ways, the histogram, per-position acceptance and agreement, by hand."""
    recs = [
        {
            "rounds": [3, 1, 2],
            "position_attempts": [3, 2, 1],
            "position_hits": [2, 1, 0],
            "agreement": {"match": 5, "total": 6},
            "ddtree": {"4": [4, 2]},
        },
        {
            "rounds": [1],
            "position_attempts": [1, 0, 0],
            "position_hits": [0, 0, 0],
            "agreement": {"match": 1, "total": 1},
            "ddtree": {"4": [1]},
        },
    ]
    m = summarize(recs, 4, [4], None, 64)
    assert m["samples"] == 2 and (m["rounds"], m["tokens"]) == (4, 7)
    assert m["tau_per_sample_mean"] == pytest.approx((2.0 + 1.0) / 2)
    assert m["tau_token_weighted"] == pytest.approx(7 / 4)
    assert m["acceptance_histogram"] == {"1": 2, "2": 1, "3": 1, "4": 0}
    assert [p["rate"] for p in m["per_position_acceptance"]] == [0.5, 0.5, 0.0]
    assert m["target_agreement"] == {"match": 6, "total": 7, "rate": 6 / 7}
    assert m["ddtree"]["4"]["tau_per_sample_mean"] == pytest.approx((3.0 + 1.0) / 2)
    assert registry.live_values(recs) == {
        "tau_per_sample_mean": m["tau_per_sample_mean"],
        "tau_token_weighted": m["tau_token_weighted"],
    }


def test_a_follow_history_written_with_the_old_names_still_reads(tmp_path, screen):
    """history.json entries from before the registry (``tau``, ``tau_tokens``) read as
    the registry's names, in one place: the follow folder's reader."""
    from orchestrator.commands import output
    from orchestrator.eval.follow import loop as follow

    old = [
        {"step": 5, "checkpoint": "step_5", "state": "done", "tau": 1.734, "tau_tokens": 1.612,
         "ddtree": {"8": 2.25}, "target_agreement": 0.9},
    ]  # fmt: skip
    (tmp_path / follow.HISTORY).write_text(json.dumps(old))
    (h,) = follow.read_history(tmp_path)
    assert (h["tau_per_sample_mean"], h["tau_token_weighted"]) == (1.734, 1.612)
    text = screen(output.render_follow, tmp_path)
    assert re.search(r"\b5\s+step_5\s+1\.734\s+1\.612\b", text), text
