"""`results compare` and the views above temperature 0 (docs/results.md): the expected tau
leads, the interval resamples prompts with their sampled completions, and runs whose
ground truths were sampled apart (other seeds) are compared by prompt with an interval
that holds both runs' sampling noise; its coverage is checked by simulation."""

from __future__ import annotations

import json
import random
from pathlib import Path

from orchestrator.results import breakdown, report, summary
from orchestrator.results import compare as cmp
from orchestrator.results import store as res
from orchestrator.results.bootstrap import bootstrap_interval, cluster_interval
from remote.eval.metrics import summarize
from tests.helpers.runs import BLOCK, BUDGETS, edit_result, make_run

PROMPTS, K = 12, 3


def sampled_run(root: Path, name: str, taus: dict, gt: str, policy: str = "sample") -> res.Run:
    """A run at T=0.7 whose records are completion ``p#k`` with expected tau ``taus[p, k]``
    (and a walk's tau of 1, which no view may lead with); its ground truth's sha256 `gt`."""
    folder = make_run(root, name, name, 1, samples=PROMPTS * K)
    recs = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    for rec, ((p, k), tau) in zip(recs, sorted(taus.items()), strict=True):
        n = rec["completion_tokens"]
        rec.update(id=f"p{p}#{k}", prompt_id=f"p{p}", index=k, rounds=[1] * n)
        rec["category"] = "even" if p % 2 == 0 else "odd"
        rec["expected"] = {
            "tokens": n,
            "rounds": n / tau,
            "tau": tau,
            "histogram": {"1": n / tau},
            "position_attempts": [1.0] * (BLOCK - 1),
            "position_hits": [0.5] * (BLOCK - 1),
        }
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    def change(doc: dict) -> None:
        doc["inputs"]["ground_truth_sha256"] = gt
        doc["metrics"] = summarize(recs, BLOCK, list(BUDGETS), None, 64)

    edit_result(folder, change)
    spec = json.loads((folder / "spec.json").read_text())
    spec["sampling"] = {"temperature": 0.7, "seed": 1, "completions": K}
    spec["eval"] = {"draft_policy": policy}
    (folder / "spec.json").write_text(json.dumps(spec))
    return res.load_run(folder)


def taus(rng: random.Random, prompt: dict, shift: float, noise: dict | None = None) -> dict:
    """tau per completion: the prompt's level, `shift`, and the completion's own noise
    (`noise`: shared with another run, as one ground truth shares its completions)."""
    noise = noise or {(p, k): rng.gauss(0, 0.4) for p in range(PROMPTS) for k in range(K)}
    return {key: 2 + prompt[key[0]] + shift + noise[key] for key in noise}


def test_sampled_runs_lead_with_expected_tau_and_pair_their_completions(tmp_path):
    rng = random.Random(3)
    prompt = {p: rng.gauss(0, 1) for p in range(PROMPTS)}
    noise = {(p, k): rng.gauss(0, 0.4) for p in range(PROMPTS) for k in range(K)}
    a = sampled_run(tmp_path, "a", taus(rng, prompt, 0.0, noise), "b" * 64)
    b = sampled_run(tmp_path, "b", taus(rng, prompt, 0.1, noise), "b" * 64)
    shared = cmp.paired(a, b)
    assert shared.comparable and shared.pairing == "completions"
    lead = cmp.headline(shared.deltas)
    assert lead.metric == "expected_tau"
    assert abs(lead.delta - 0.1) < 1e-9 and lead.low > 0  # the shared noise cancels
    assert lead.improved == 1.0
    # the chain walk's tau (1 here) is no delta above temperature 0
    assert not [d for d in shared.deltas if d.metric == "tau_per_sample_mean" and not d.budget]
    by_cat = [g for g in shared.groups if g.axis == "category"]
    assert {g.name for g in by_cat} == {"even", "odd"}
    assert all(cmp.group_lead(g).metric == "expected_tau" for g in by_cat)
    assert any(g.axis == "completion_length" for g in shared.groups)
    # the report's delta column says whose delta it is: the expected tau's, not the walk's
    html = report.comparison_section([a, b], a, {"b": shared})
    assert f"Δ {lead.label} vs baseline" in html and lead.label != "tau"

    # another seed: other completions, compared by prompt; the interval widens
    c = sampled_run(tmp_path, "c", taus(rng, prompt, 0.1), "d" * 64)
    apart = cmp.paired(a, c)
    assert apart.comparable, apart.problems
    assert apart.pairing == "prompts"
    lead2 = cmp.headline(apart.deltas)
    assert lead2.improved is None
    assert lead2.high - lead2.low > 3 * (lead.high - lead.low)
    assert not any(g.axis == "completion_length" for g in apart.groups)
    # greedy beside a sampled run is still refused, and another ground truth at greedy too
    g1 = res.load_run(make_run(tmp_path, "g1", "g1", 1))
    assert not cmp.paired(g1, a).comparable


def test_the_views_show_expected_tau_by_category_and_length_only_when_sampled(tmp_path):
    rng = random.Random(4)
    prompt = {p: rng.gauss(0, 1) for p in range(PROMPTS)}
    run = sampled_run(tmp_path, "a", taus(rng, prompt, 0.0), "b" * 64)
    recs = res.records(run)
    want = sum(r["expected"]["tau"] for r in recs) / len(recs)
    assert abs(summary.values(run)["expected_tau"] - want) < 1e-9
    flat = breakdown.flat(run)
    even = [r["expected"]["tau"] for r in recs if r["category"] == "even"]
    assert abs(flat["expected_tau_category_even"] - sum(even) / len(even)) < 1e-9
    assert any(k.startswith("expected_tau_completion_length_") for k in flat)
    assert "expected_tau" in [m.name for m in summary.columns([summary.values(run)])]
    greedy = res.load_run(make_run(tmp_path, "g", "g", 1, categories=("x", "y")))
    assert not any(k.startswith("expected_tau") for k in breakdown.flat(greedy))
    assert "expected_tau" not in [m.name for m in summary.columns([summary.values(greedy)])]


def test_prompt_clusters_cover_where_a_per_completion_bootstrap_does_not():
    """Two runs with completions sampled apart, K per prompt, and a drafter effect that
    varies by prompt: over 200 simulated comparisons the prompt-cluster interval holds
    the true delta about 95% of the time; treating the completions as independent
    samples covers far less (so this test can fail)."""
    rng = random.Random(7)
    true, cover, naive, sims = 0.2, 0, 0, 200
    for s in range(sims):
        vals, clusters = [], []
        for p in range(20):
            level, effect = rng.gauss(0, 1), rng.gauss(0, 1.5)
            for _ in range(4):
                vals.append(level + effect + true + rng.gauss(0, 0.7) - level - rng.gauss(0, 0.7))
                clusters.append(f"p{p}")
        lo, hi = cluster_interval(vals, clusters, 1000, 0.95, s)
        cover += lo <= true <= hi
        lo, hi = bootstrap_interval(vals, 1000, 0.95, s)
        naive += lo <= true <= hi
    assert cover / sims > 0.88
    assert naive / sims < 0.85
