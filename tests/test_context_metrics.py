"""tau by context position (#51): every round placed by where it starts (prompt +
completion so far), summed per power-of-two bucket and per curve point by the registry's
entries, the cliff finder's line, and each view (show, CSV, compare with paired intervals
per bucket and its gate, plots). Run folders come from `tests.helpers.runs`, summarised
by the engine's own `summarize`."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from orchestrator.results import catalog, export, plots
from orchestrator.results import store as res
from remote.eval.metrics import summarize
from remote.protocol import check_result, context
from tests.helpers.runs import make_run
from tests.helpers.screen import console_at


def test_buckets_are_powers_of_two_from_512():
    assert [context.bucket(p) for p in (0, 511, 512, 1023, 1024, 5000, 16384)] == [
        0, 0, 512, 512, 1024, 4096, 16384,
    ]  # fmt: skip
    assert context.buckets(100, 5000) == [0, 512, 1024, 2048, 4096]
    assert context.buckets(1500, 1600) == [1024]
    # eight curve points per doubling: 64 wide below 1024, 128 up to 2048, ...
    assert [context.point(p) for p in (63, 64, 1100, 2100, 9000)] == [0, 64, 1024, 2048, 8192]


def test_rounds_are_placed_by_where_they_start():
    """A sample whose completion crosses 1024: its rounds before and after, by hand."""
    rec = {"prompt_tokens": 1020, "rounds": [3, 2, 4, 1]}  # starts 1020, 1023, 1025, 1029
    assert context.rounds_of(rec) == [
        (1020, 3, False), (1023, 2, False), (1025, 4, False), (1029, 1, True),
    ]  # fmt: skip
    assert context.tau_parts(rec, 4) == {512: (5, 2), 1024: (5, 2)}
    assert context.histogram_parts(rec, 4) == {
        (512, 3): (1, 0), (512, 2): (1, 0), (1024, 4): (1, 0), (1024, 1): (1, 0),
    }  # fmt: skip
    # Block 4: a round of n accepted 1..n-1 and refused n (n < 4); the last round, cut by
    # the end, says nothing of its n.
    assert context.position_parts(rec, 4) == {
        (512, 1): (2, 2), (512, 2): (1, 2), (512, 3): (0, 1),
        (1024, 1): (1, 1), (1024, 2): (1, 1), (1024, 3): (1, 1),
    }  # fmt: skip
    m = summarize([rec, {"prompt_tokens": 3000, "rounds": [2, 2]}], 4, [], None, 64)
    rows = {r["context"]: (r["tokens"], r["rounds"]) for r in m["tau_by_context"]}
    assert rows == {512: (5, 2), 1024: (5, 2), 2048: (4, 2)}
    hist = {(r["context"], r["length"]): r["rounds"] for r in m["acceptance_histogram_by_context"]}
    assert hist[(1024, 4)] == 1 and hist[(2048, 2)] == 2 and hist[(2048, 4)] == 0
    assert [r["position"] for r in m["tau_by_position"]] == [960, 1024, 2816]


def cliff_runs(root, at: int | None):
    """Two runs over a ladder of 8 samples at each of 600 .. 9000 tokens; the second's
    drafter loses its skill from context `at` on (None: never)."""
    ladder = (600, 1100, 2100, 4200, 9000)
    make_run(root, "short", "step-1", 1, skill=0.7, samples=40, contexts=ladder)
    skill = lambda p: 0.7 if at is None or p < at else 0.15  # noqa: E731
    return make_run(root, "long", "step-2", 2, samples=40, contexts=ladder, context_skill=skill)


def test_the_cliff_finder_names_the_first_bucket_below_the_first(tmp_path):
    run = res.load_run(cliff_runs(tmp_path, at=4000))
    line = run.metrics["context_cliff"]
    assert line.startswith("at context 4096: tau "), line
    low, high = map(float, re.search(r"\[([-+.\d]+), ([-+.\d]+)\]", line).groups())
    assert low < high < 0
    flat = res.load_run(tmp_path / "short")
    assert flat.metrics["context_cliff"].startswith("none: no bucket up to 8192"), flat.metrics


def test_one_bucket_or_too_few_samples_is_not_judged():
    one = summarize([{"prompt_tokens": 30, "rounds": [2, 1]}] * 3, 4, [], None, 64)
    assert one["context_cliff"].startswith("not judged: one context bucket")
    few = [{"prompt_tokens": 30, "rounds": [3, 3]}, {"prompt_tokens": 2000, "rounds": [1, 1]}]
    assert summarize(few, 4, [], None, 64)["context_cliff"].startswith("not judged: too few")
    assert summarize([{"prompt_tokens": 5, "rounds": []}], 4, [], None, 64)["context_cliff"] is None


def test_every_view_has_tau_per_bucket(tmp_path):
    from orchestrator.commands import output

    cliff_runs(tmp_path, at=4000)
    a, b = res.load_run(tmp_path / "short"), res.load_run(tmp_path / "long")
    check_result(json.loads((b.path / "result.json").read_text()))  # the contract's types
    want = {r["context"]: r["rate"] for r in b.metrics["tau_by_context"]}
    assert list(want) == [512, 1024, 2048, 4096, 8192]

    with console_at(200) as con:
        with con.capture() as cap:
            output.render_run(b)
        shown = cap.get()
        c = catalog.compare(["short", "long"], tmp_path, None)
        with con.capture() as cap:
            output.render_comparison(c)
        compared = cap.get()
    assert re.search(rf"^\W*4096\W+\d+\W+\d+\W+{want[4096]:.3f}\W*$", shown, re.M), shown
    assert "cliff in tau by context" in shown and "at context 4096" in shown

    row = next(csv.DictReader(io.StringIO(export.render_csv([b]))))
    assert float(row["tau_by_context_2048"]) == pytest.approx(want[2048])
    assert "per_position_acceptance_by_context_8192_1" in row
    assert export.scalars(b)["tau_by_context/8192"] == pytest.approx(want[8192])

    # compare: a paired delta per bucket with its interval, in the table and the JSON
    (p,) = c.to_json()["paired"]
    per = {g["name"]: g for g in p["groups"] if g["axis"] == "context"}
    assert set(per) == {"512", "1024", "2048", "4096", "8192"}
    (d,) = per["8192"]["deltas"]
    early = per["512"]["deltas"][0]
    assert d["label"] == "tau at context 8192" and d["high"] < 0
    assert d["delta"] < early["delta"] - 0.5 and per["8192"]["samples"] == 8
    assert "tau by context" in compared and re.search(r"^\W*8192\s+8\s", compared, re.M), compared

    # the CI gate, per bucket: B is worse from 4096 on
    gated = catalog.compare(["short", "long"], tmp_path, None, gate_options=_gate(["context"]))
    assert not gated.gate.passed and re.search(r"\(context (4096|8192)\)", gated.gate.line)

    files = {p.name for p in plots.plot_run(b)}
    assert {"tau_by_context.png", "tau_by_position.png"} <= files
    assert "per_position_acceptance_by_context.png" in files
    assert a.metrics["context_cliff"].startswith("none")


def _gate(by):
    from orchestrator.results.gate import gate_request

    return gate_request(None, True, None, by)
