"""Speculative sampling at temperature above 0 (docs/dflash-eval.md), on a tiny target
sharpened so its top-1 probability is about 0.8 at T=0.5 and 0.58 at T=1 (a random tiny
target's logits are flat: tau near 1 there whatever the drafter), with a drafter trained
on it for real:

- the reference loop (`orchestrator.demo.oracle.sampled_rounds`) is lossless: the
  frequencies of its first speculated token over many seeds match the target's own
  sampling distribution by a chi-square test at level 0.001, for both draft policies; the
  same test fails when z-lab#74's kind of bug is injected (drafts sampled at another
  temperature than the q of the acceptance ratio);
- the offline expectation (`remote.eval.sampled`, along completions sampled from the
  target) equals the loop's mean rounds and per-position acceptance rates over 2000
  seeded runs within the 99% interval of the difference (both sides' standard errors),
  at two temperatures and for both policies (this drafter accepts little: tau about
  1.0-1.1, so the test checks the rejection side far more than long runs);
- the engine's ``expected`` block, the feature cache serving two temperatures, the
  expectation against drawn walks, the two processings against each other, and
  `results compare` refusing runs at different sampling.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch

from orchestrator.demo.oracle import hf_model, processed_probs, sampled_rounds

SHARPEN = 30.0  # the final norm's weight times this: logits 30 times as far apart
PROMPT = [5, 17, 42, 99, 7, 3, 61, 12]
Z99 = 2.5758  # two-sided 99%


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: thousands of tiny forwards, which extra threads only slow down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sharp_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target folder, drafter checkpoint): a tiny Qwen3 target with sharpened logits and
    a drafter trained on it."""
    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.train import train_drafter

    root = tmp_path_factory.mktemp("sharp")
    target = Path(build_qwen3_target(str(root / "target")))
    model = hf_model(str(target))
    with torch.no_grad():
        model.model.norm.weight.mul_(SHARPEN)
    model.save_pretrained(str(target))
    (drafter,) = train_drafter(
        str(target), str(root / "drafters"), save_steps=(12,), samples=6, batch_samples=3
    )
    return target, Path(drafter)


def chi2_critical(df: int, z: float = 3.0902) -> float:
    """The chi-square quantile of `df` degrees of freedom at the normal quantile `z`
    (3.0902: level 0.001), by Wilson and Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@torch.inference_mode()
def second_token_probs(model, temperature: float) -> torch.Tensor:
    """The target's own sampling distribution of the completion's second token:
    sum over the first token y of p(y) p(. | y), every y in one batched forward."""
    first = processed_probs(model(input_ids=torch.tensor([PROMPT])).logits[0, -1], temperature)
    vocab = first.shape[0]
    seqs = torch.tensor([PROMPT + [y] for y in range(vocab)])
    return first @ processed_probs(model(input_ids=seqs).logits[:, -1], temperature)


def chi2_statistic(seen: Counter, probs: torch.Tensor, runs: int) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the tokens `seen` against `probs`: one bin per
    token expected at least 5 times, the rest in one more bin."""
    kept = [t for t in range(len(probs)) if float(probs[t]) * runs >= 5]
    stat = sum((seen[t] - float(probs[t]) * runs) ** 2 / (float(probs[t]) * runs) for t in kept)
    rest_expected = runs * (1 - sum(float(probs[t]) for t in kept))
    rest_seen = runs - sum(seen[t] for t in kept)
    stat += (rest_seen - rest_expected) ** 2 / max(rest_expected, 1e-9)
    return stat, len(kept)


@pytest.mark.slow
def test_the_sampling_loop_is_lossless_and_catches_a_draft_temperature_bug(sharp_pair):
    """Two new tokens at T=1 (the first from the target, the second from the first
    speculative round's depth 1) over 2000 seeds: the second token's frequencies pass the
    chi-square test against the target's own distribution for both policies, and fail it
    with drafts sampled at 0.2 while q is taken at 1.0 (z-lab#74's kind of bug)."""
    target, drafter_path = sharp_pair
    from remote.eval.drafter import load_drafter

    model = hf_model(str(target))
    drafter, _ = load_drafter(str(drafter_path), torch.float32)
    runs, t = 2000, 1.0
    probs = second_token_probs(model, t)

    def seen(policy: str, draft_temperature: float | None = None) -> Counter:
        return Counter(
            sampled_rounds(
                model,
                drafter,
                PROMPT,
                2,
                t,
                policy=policy,
                seed=s,
                draft_temperature=draft_temperature,
            )["completion"][1]
            for s in range(runs)
        )

    for policy in ("argmax", "sample"):
        stat, df = chi2_statistic(seen(policy), probs, runs)
        assert df >= 5 and stat < chi2_critical(df), (policy, stat, df)
    stat, df = chi2_statistic(seen("sample", draft_temperature=0.2), probs, runs)
    assert stat > chi2_critical(df), (stat, df)


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def ratio_se(hits: list[float], attempts: list[float]) -> tuple[float, float]:
    """Σhits / Σattempts over units, with its delta-method standard error."""
    rate = sum(hits) / sum(attempts)
    resid = [h - rate * a for h, a in zip(hits, attempts, strict=True)]
    mean_a = statistics.fmean(attempts)
    return rate, statistics.stdev(resid) / (mean_a * math.sqrt(len(hits)))


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_offline_expectation_equals_the_loops_mean(sharp_pair, temperature):
    """Offline, along 200 completions sampled from the target at T: expected rounds and
    per-position acceptance for argmax and sampled drafts; online, 2000 seeded runs of the
    loop per policy. Each pair agrees within the 99% interval of their difference."""
    from remote.eval import sampled
    from remote.eval import target as target_mod
    from remote.eval.drafter import load_drafter
    from remote.eval.logits import Processing

    target, drafter_path = sharp_pair
    model = hf_model(str(target))
    tgt = target_mod.load_target(str(target), torch.float32)
    drafter, _ = load_drafter(str(drafter_path), torch.float32)
    new, completions, runs = 8, 200, 2000
    offline: dict[str, list] = {"argmax": [], "sample": []}
    for k in range(completions):
        torch.manual_seed(10_000 + k)
        ids = model.generate(
            torch.tensor([PROMPT]),
            do_sample=True,
            temperature=temperature,
            top_k=0,
            max_new_tokens=new,
            min_new_tokens=new,
        )[0].tolist()
        feats, _greedy, final = tgt.forward(
            ids, drafter.cfg.target_layer_ids, argmax_from=len(PROMPT) - 1, final=True
        )
        for policy, got in offline.items():
            got.append(
                sampled.expectation(
                    tgt, drafter, ids, len(PROMPT), feats, final, Processing(temperature), policy
                )
            )
    for policy, expected in offline.items():
        loop = [
            sampled_rounds(model, drafter, PROMPT, new, temperature, policy=policy, seed=s)
            for s in range(runs)
        ]
        off_mean, off_se = mean_se([e.rounds for e in expected])
        on_mean, on_se = mean_se([len(r["rounds"]) for r in loop])
        bound = Z99 * math.hypot(off_se, on_se)
        assert abs(off_mean - on_mean) <= bound, (policy, off_mean, on_mean, bound)
        assert sum(r["hits"][0] for r in loop) > 0  # some drafts accepted
        for j in range(drafter.block_size - 1):
            tried = sum(r["attempts"][j] for r in loop)
            if tried < 100:  # a depth the runs barely reach: no rate to compare
                continue
            off = ratio_se([e.hits[j] for e in expected], [e.attempts[j] for e in expected])
            on = ratio_se([r["hits"][j] for r in loop], [r["attempts"][j] for r in loop])
            bound = Z99 * math.hypot(off[1], on[1])
            assert abs(off[0] - on[0]) <= bound, (policy, j, off, on, bound)


def test_the_engine_at_a_temperature_gives_the_expectation_and_caches_for_every_one(
    sharp_pair, tmp_path
):
    """`run_eval` at T=0.7 (sampled drafts, ``positions: all``) over a ground truth sampled
    at 0.7: each record's ``expected`` is the expectation of its completion computed
    directly, the result's ``expected`` says the settings and the method; the feature cache
    then serves T=1.0 (argmax drafts, the walk's rounds) and seeded walks at 0.7 from the
    same entries; at T=0 no ``expected``, and the same DDTree rounds as at 0.7 (the tree
    walk along the sampled completion)."""
    import json

    from remote.eval import sampled
    from remote.eval import target as target_mod
    from remote.eval.drafter import load_drafter
    from remote.eval.engine import run_eval
    from remote.eval.feature_cache import FeatureCache
    from remote.eval.logits import Processing
    from remote.protocol import EvalSpec

    target, drafter_path = sharp_pair
    model = hf_model(str(target))
    rows = []
    for k in range(3):
        torch.manual_seed(k)
        ids = model.generate(
            torch.tensor([PROMPT]), do_sample=True, temperature=0.7, top_k=0, max_new_tokens=10
        )[0].tolist()
        rows.append({"id": f"p#{k}", "prompt_ids": PROMPT, "completion_ids": ids[len(PROMPT) :]})
    gt = tmp_path / "gt.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = FeatureCache(tmp_path / "features", 2**30)

    def evaluate(out: str, **over) -> tuple[dict, list[dict]]:
        spec = EvalSpec(
            target=str(target),
            drafter=str(drafter_path),
            ground_truth=str(gt),
            output_dir=str(tmp_path / out),
            dtype="float32",
            **over,
        )
        result = run_eval(spec, on_event=lambda ev: None, features=cache)
        lines = (tmp_path / out / "samples.jsonl").read_text().splitlines()
        return result, [json.loads(line) for line in lines]

    result, records = evaluate(
        "warm", temperature=0.7, draft_policy="sample", positions="all", budgets=[4]
    )
    tgt = target_mod.load_target(str(target), torch.float32)
    drafter, _ = load_drafter(str(drafter_path), torch.float32)
    for row, rec in zip(rows, records, strict=True):
        ids = row["prompt_ids"] + row["completion_ids"]
        feats, _g, final = tgt.forward(
            ids, drafter.cfg.target_layer_ids, argmax_from=len(PROMPT) - 1, final=True
        )
        want = sampled.expectation(
            tgt, drafter, ids, len(PROMPT), feats, final, Processing(0.7), "sample"
        )
        assert rec["expected"]["rounds"] == pytest.approx(want.rounds)
        assert rec["expected"]["position_hits"] == pytest.approx(want.hits)
    assert result["inputs"]["target_features"]["cached"] is False  # the walk computed them
    exp = result["expected"]
    assert exp["temperature"] == 0.7 and exp["draft_policy"] == "sample"
    assert exp["method"] == "dp" and exp["exact"] is True
    assert exp["samples"] == 3 and 1 < exp["tau_token_weighted"] < 4
    hot, hot_records = evaluate("hot", temperature=1.0)
    assert hot["inputs"]["target_features"]["cached"] is True
    assert hot["expected"]["draft_policy"] == "argmax"
    assert hot["expected"]["method"] == "walk" and hot["expected"]["exact"] is True
    assert hot["expected"]["tau"] != exp["tau"]
    assert [r["expected"]["rounds"] for r in hot_records] == [len(r["rounds"]) for r in records]
    drawn, _ = evaluate("drawn", temperature=0.7, draft_policy="sample")
    assert drawn["expected"]["method"] == "seeded" and drawn["expected"]["exact"] is False
    assert drawn["expected"]["seed"] == 0 and drawn["expected"]["tau_token_weighted_se"] is not None
    greedy, greedy_records = evaluate("greedy", budgets=[4])
    assert "expected" not in greedy and "expected" not in greedy_records[0]
    assert [r["ddtree"] for r in greedy_records] == [r["ddtree"] for r in records]


def test_seeded_walks_estimate_the_expectation_and_catch_an_inverted_ratio(sharp_pair, monkeypatch):
    """Along 3 completions sampled at T=0.7, 200 seeded walks each (`remote.eval.seeded`,
    in the engine's lockstep walk): sampled drafts' mean rounds and tau equal the exact
    expectation within the 99% interval of the pooled difference; the same check fails
    with the acceptance ratio inverted (min(1, p/q)). Argmax drafts: the walk's rounds and
    per-position weights are the exact expectation itself."""
    from remote.eval import sampled, seeded
    from remote.eval import target as target_mod
    from remote.eval.drafter import load_drafter
    from remote.eval.logits import Processing
    from remote.eval.walk import WalkOptions, eval_batch

    target, drafter_path = sharp_pair
    model = hf_model(str(target))
    tgt = target_mod.load_target(str(target), torch.float32)
    drafter, _ = load_drafter(str(drafter_path), torch.float32)
    t, draws, pp = 0.7, 200, Processing(0.7)
    runs = []
    for k in range(3):
        torch.manual_seed(100 + k)
        ids = model.generate(
            torch.tensor([PROMPT]), do_sample=True, temperature=t, top_k=0, max_new_tokens=12
        )[0].tolist()
        got = tgt.forward(ids, drafter.cfg.target_layer_ids, len(PROMPT) - 1, final=True)
        exact = {
            policy: sampled.expectation(tgt, drafter, ids, len(PROMPT), *got[::2], pp, policy)
            for policy in ("argmax", "sample")
        }
        runs.append((ids, got, exact))

    def walked(ids, got, policy: str, n: int) -> list[dict]:
        names = [f"c{ids[-1]}#{r}" for r in range(n)]
        walks = seeded.Walks(tgt, pp, policy, 0, names)
        sample = (ids[: len(PROMPT)], ids[len(PROMPT) :])
        recs = eval_batch(tgt, drafter, [sample] * n, WalkOptions(sampler=walks), [got] * n)
        return [r["expected"] for r in recs]

    def pooled_z() -> list[float]:
        """z of the summed differences, for rounds and for tau."""
        diff, var = [0.0, 0.0], [0.0, 0.0]
        for ids, got, exact in runs:
            drawn = walked(ids, got, "sample", draws)
            for m, (key, want) in enumerate(
                (("rounds", exact["sample"].rounds), ("tau", exact["sample"].tau))
            ):
                mean, se = mean_se([e[key] for e in drawn])
                diff[m] += mean - want
                var[m] += se**2
        return [d / math.sqrt(v) if v else math.inf * d for d, v in zip(diff, var, strict=True)]

    for ids, got, exact in runs:
        (mine,) = walked(ids, got, "argmax", 1)
        assert mine["rounds"] == exact["argmax"].rounds and mine["tau"] == exact["argmax"].tau
        assert mine["position_hits"] == pytest.approx(exact["argmax"].hits)
    assert all(abs(z) <= Z99 for z in pooled_z())
    monkeypatch.setattr(seeded, "accepts", lambda qy, py: sampled.accepts(py, qy))
    assert any(abs(z) > Z99 for z in pooled_z())


def test_the_expectation_is_the_walk_for_certain_rounds_and_the_mean_of_drawn_ones():
    """0/1 acceptance: the expected rounds are the walk's count and tau its N / R;
    probabilities: expected rounds and E[N/R] equal the mean over 20000 seeded walks
    within 4 standard errors, and the histogram sums to the expected rounds."""
    import random

    from remote.eval.expectation import Expectation, seeded_rounds

    certain = [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]] * 3
    got = Expectation.of(certain, 4)
    walked = seeded_rounds(certain, 4, seed=0)
    assert got.rounds == len(walked) and got.tau == 9 / len(walked)
    rng = random.Random(1)
    acc = [[rng.random() for _ in range(3)] for _ in range(12)]
    got = Expectation.of(acc, 4)
    counts = [len(seeded_rounds(acc, 4, seed=s)) for s in range(20000)]
    ratios = [12 / c for c in counts]
    for want, drawn in ((got.rounds, counts), (got.tau, ratios)):
        mean, se = mean_se(drawn)
        assert abs(want - mean) < 4 * se
    assert sum(got.histogram.values()) == pytest.approx(got.rounds)
    assert sum(r * v for r, v in got.histogram.items()) == pytest.approx(12)


@pytest.mark.parametrize("top_k,top_p", [(None, None), (5, None), (None, 0.8), (20, 0.5)])
def test_the_engines_processing_equals_the_reference_loops(top_k, top_p):
    """`remote.eval.logits.Processing` (the offline side) and the loop's own
    `processed_probs`, written apart, give the same distributions."""
    from remote.eval.logits import Processing

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    mine = Processing(0.7, top_k, top_p).log_probs(logits).exp()
    theirs = processed_probs(logits, 0.7, top_k, top_p)
    assert torch.allclose(mine, theirs, atol=1e-6)


def test_compare_refuses_runs_at_another_temperature_or_draft_policy(tmp_path):
    """Greedy against T=0.7 argmax, and argmax against sampled drafts at T=0.7: not
    comparable, the first reason naming both settings; greedy beside greedy (an older
    run recording nothing) still is."""
    import json

    from orchestrator.results import compare, settings
    from orchestrator.results import store as res
    from tests.helpers.runs import make_run

    def run_at(name: str, sampling: dict | None, policy: str | None = None):
        folder = make_run(tmp_path, name, "step-1", 1)
        spec = json.loads((folder / "spec.json").read_text())
        if sampling:
            spec["sampling"] = sampling
            spec["eval"] = {"draft_policy": policy} if policy else {}
        (folder / "spec.json").write_text(json.dumps(spec))
        return res.load_run(folder)

    greedy, old = run_at("greedy", {"temperature": 0.0}), run_at("old", None)
    warm = run_at("warm", {"temperature": 0.7, "seed": 1})
    drawn = run_at("drawn", {"temperature": 0.7, "seed": 1}, "sample")
    assert settings.sampling(warm) == "temperature 0.7, argmax drafts"
    assert compare.comparability(greedy, old) == []
    problems = compare.comparability(greedy, warm)
    assert problems[0] == "different sampling: greedy vs temperature 0.7, argmax drafts"
    assert compare.comparability(warm, drawn)[0].endswith("vs temperature 0.7, sample drafts")


def test_results_show_says_how_the_expectation_was_computed(tmp_path):
    """A seeded estimate shows both taus with their standard errors and says it is one; an
    exact one says so; the result stays within the contract's types."""
    import json

    from orchestrator.commands import output
    from orchestrator.results import store as res
    from remote.protocol import check_result
    from tests.helpers.runs import make_run
    from tests.helpers.screen import console_at

    folder = make_run(tmp_path, "drawn", "step-1", 1)
    result = json.loads((folder / "result.json").read_text())
    shown = {}
    for method, exact, se in (("seeded", False, 0.0421), ("walk", True, None)):
        result["expected"] = {
            "method": method,
            "exact": exact,
            "tau": 2.3456,
            "tau_se": 0.1234,
            "tau_token_weighted": 2.5678,
            "tau_token_weighted_se": se,
        }
        check_result(result)
        (folder / "result.json").write_text(json.dumps(result))
        with console_at(200) as con, con.capture() as cap:
            output.render_run(res.load_run(folder))
        shown[method] = next(ln for ln in cap.get().splitlines() if "expected tau" in ln)
    assert "seeded walks, an estimate" in shown["seeded"]
    assert "2.346 ± 0.123 / 2.568 ± 0.042" in shown["seeded"]
    assert "exact, the walk's rounds" in shown["walk"] and "2.346 ± 0.123 / 2.568 " in shown["walk"]
