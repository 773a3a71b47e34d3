"""`dflash online` above temperature 0 (docs/online.md, "Above temperature 0"): the
engine's rounds along its own sampled completions against their exact distribution from
the offline acceptance probabilities.

The engine here is the reference speculative-sampling loop
(`orchestrator.demo.oracle.sampled_rounds`) on a tiny target sharpened so its top-1
probability is well inside (0.3, 0.95) at T=0.5, with a drafter trained on it: the
verdict agrees with the expectation at the loop's own settings and flags one computed
for the other draft policy or at half the temperature (this drafter accepts little, tau
about 1.02: an expectation at T=0.7 or 2.0 is within its interval over 24 prompts, one at
0.25 or 0.1 is not). vLLM itself: tests/test_online_vllm.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from orchestrator.demo.oracle import hf_model, sampled_rounds
from remote.eval.expectation import Expectation
from remote.online import distribution, verdict
from remote.online.verdict_doc import check_verdict

SHARPEN = 30.0
PROMPTS = 24
NEW = 24  # completion tokens per prompt
T = 0.5


def test_rounds_pmf_is_the_expectations_distribution():
    acc = [[0.9, 0.5, 0.2], [0.3, 0.3, 0.3], [1.0, 0.0, 0.7], [0.6, 0.6, 0.6], [0.5, 0.5, 0.5]]
    pmf = distribution.rounds_pmf(acc, 4)
    e = Expectation.of(acc, 4)
    assert sum(pmf) == pytest.approx(1.0) and pmf[0] == 0.0
    assert sum(c * p for c, p in enumerate(pmf)) == pytest.approx(e.rounds)
    assert sum(5 / c * p for c, p in enumerate(pmf) if c) == pytest.approx(e.tau)
    certain = distribution.rounds_pmf([[1.0, 0.0, 0.0], [0.0] * 3, [1.0, 1.0, 0.0]], 4)
    assert certain == [0.0, 0.0, 1.0, 0.0]  # argmax drafts: the rounds are the completion's
    assert distribution.p_value(certain, 2) == 1.0 and distribution.p_value(certain, 3) == 0.0
    lo, hi = distribution.interval(pmf, 0.01)
    assert sum(pmf[lo : hi + 1]) >= 0.99 and lo >= 1


def test_the_total_leaves_out_only_negligible_mass():
    """`convolve` sums over each distribution's band; it equals the full sum."""
    rng = random.Random(3)
    acc = [[rng.uniform(0.2, 0.95) for _ in range(7)] for _ in range(60)]
    pmfs = [distribution.rounds_pmf(acc[i:], 8) for i in range(0, 30, 3)]
    total = [1.0]
    for pmf in pmfs:  # the plain convolution, every pair of counts
        out = [0.0] * (len(total) + len(pmf) - 1)
        for a, u in enumerate(total):
            for b, v in enumerate(pmf):
                out[a + b] += u * v
        total = out
    banded = distribution.convolve(pmfs)
    assert len(banded) == len(total) and sum(banded) == pytest.approx(1.0, abs=1e-12)
    assert max(abs(x - y) for x, y in zip(banded, total, strict=True)) < 1e-15
    assert len(distribution.band(banded)) < len(banded) / 2  # the band does cut


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """(target, drafter, rows, online samples) of the loop at T with sampled drafts, and
    the same with argmax drafts: each prompt once, seeded by its index."""
    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.train import train_drafter
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sharp")
    path = Path(build_qwen3_target(str(root / "target")))
    model = hf_model(str(path))
    with torch.no_grad():
        model.model.norm.weight.mul_(SHARPEN)
    model.save_pretrained(str(path))
    (dpath,) = train_drafter(
        str(path), str(root / "drafters"), save_steps=(12,), samples=6, batch_samples=3
    )
    drafter, _ = load_drafter(str(dpath), torch.float32)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 300, (8,), generator=gen).tolist() for _ in range(PROMPTS)]
    runs = {}
    for policy in ("sample", "argmax"):
        rows, samples = [], []
        for i, prompt in enumerate(prompts):
            got = sampled_rounds(model, drafter, prompt, NEW, T, policy=policy, seed=i)
            rows.append({"id": i, "prompt_ids": prompt, "completion_ids": got["completion"]})
            samples.append(online_sample(i, got, drafter.block_size - 1))
        runs[policy] = (rows, samples)
    target = load_target(str(path), torch.float32)
    yield target, drafter, runs
    torch.set_num_threads(threads)


def online_sample(i: int, got: dict, k: int) -> dict:
    """The loop's run as the vLLM client reads a request (per-step accepted counts)."""
    acc = [r - 1 for r in got["rounds"]]
    return {
        "id": i,
        "token_ids": got["completion"],
        "num_spec_tokens": k,
        "per_step_accepted": acc,
        "per_step_drafted": [k] * len(acc),
    }


def judged(engine_runs, engine_policy: str, temperature: float, policy: str) -> dict:
    """The verdict of the loop's runs (`engine_policy`) against the expectation computed
    at `temperature` with `policy`."""
    from remote.eval.logits import Processing
    from remote.online.expected import pmfs

    target, drafter, runs = engine_runs
    rows, samples = runs[engine_policy]
    offline = [{"id": s["id"], "rounds": [a + 1 for a in s["per_step_accepted"]]} for s in samples]
    result = verdict.compare(rows, offline, samples, block_size=drafter.block_size)
    got = pmfs(target, drafter, rows, Processing(temperature), policy)
    sampling = {"temperature": temperature, "seed": 0, "draft_policy": policy}
    return check_verdict(distribution.judge(result, got, sampling))


@pytest.mark.parametrize("policy", ["sample", "argmax"])
def test_the_expectation_at_the_engines_settings_agrees(engine_runs, policy):
    v = judged(engine_runs, policy, T, policy)
    d = v["distribution"]
    assert v["verdict"] == "agree", v["diagnosis"]
    assert d["agree"] and d["p_value"] > distribution.LEVEL and d["samples"] == PROMPTS
    lo, hi = d["tau_interval"]
    assert lo <= d["observed_tau"] <= hi and d["tokens"] == PROMPTS * (NEW - 1)
    assert v["offline"]["tau_token_weighted"] == d["expected_tau"] > 1.0
    if policy == "argmax":  # argmax drafts: the rounds along a completion are certain
        assert d["p_value"] == 1.0 and d["observed_rounds"] == d["expected_rounds"]


@pytest.mark.parametrize(
    ("engine", "temperature", "policy"),
    [("sample", T, "argmax"), ("argmax", T, "sample"), ("sample", T / 2, "sample")],
)
def test_a_wrong_expectation_is_flagged(engine_runs, engine, temperature, policy):
    """The expectation computed for the other draft policy, or at another temperature,
    disagrees with the engine's rounds by the verdict's own test."""
    v = judged(engine_runs, engine, temperature, policy)
    d = v["distribution"]
    assert v["verdict"] == "distribution_differs", (d["p_value"], d["observed_tau"])
    assert not d["agree"] and d["p_value"] <= distribution.LEVEL
    line = v["diagnosis"][0]["detail"]
    assert f"{policy} drafts" in line and "outside the offline expectation" in line
