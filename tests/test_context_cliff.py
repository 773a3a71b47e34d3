"""A real cliff on tiny models (#51): a drafter trained on short contexts only, whose
window the run's longest context passes, loses acceptance at long context, and the cliff
finder names the bucket; the same recipe trained on contexts covering the run shows none;
the preflight warns, before anything loads, for the first and not the second.

The target is a tiny Qwen3 whose attention outputs are zeroed (``o_proj``): its next token
depends on the current token alone, so its greedy completions are as predictable after 2100
tokens as after 100, and whatever changes with the context is the drafter's. A drafter
trained on at most 132 positions spreads its attention over every context position it is
given: at 2100 positions its own block's keys are drowned (acceptance falls); one trained
up to 2132 positions has learnt to keep to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.jobs import run_eval_job

pytestmark = pytest.mark.slow

SHORT, LONG = 100, 2100  # the evaluated prompts' lengths: buckets 0 and 2048
NEW = 32
STEPS = 400


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    from safetensors.torch import load_file, save_file

    from orchestrator.demo.models import build_qwen3_target
    from orchestrator.demo.train import make_ground_truth, train_drafter

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cliff")
    target = build_qwen3_target(str(root / "target"))
    weights = Path(target) / "model.safetensors"
    w = load_file(weights)
    save_file(
        {k: torch.zeros_like(v) if "o_proj" in k else v for k, v in w.items()},
        weights,
        metadata={"format": "pt"},
    )

    def rows(lengths, n, seed):
        out = []
        for i, p in enumerate(lengths):
            out += make_ground_truth(target, n, prompt_len=p, completion_len=NEW, seed=seed + i)
        return [{**r, "id": f"s{j}"} for j, r in enumerate(out)]

    short = rows([20, 60, 100], 8, 10)
    covering = rows([20, 300, 700, 1100, 1600, 2100], 4, 20)
    gt = root / "gt.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in rows([SHORT, LONG], 8, 30)))
    drafters = {}
    for name, data in (("short", short), ("covering", covering)):
        (path,) = train_drafter(
            target, str(root / name), save_steps=(STEPS,), rows=data, batch_samples=4
        )
        drafters[name] = path
    cfg = Path(drafters["short"]) / "config.json"  # trained on <= 132 positions
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "max_position_embeddings": 512}))
    return {"root": root, "target": target, "gt": str(gt), "drafters": drafters}


def run(setup: dict, name: str) -> tuple[dict, list[dict]]:
    """An eval job of drafter `name` over the ground-truth file, preflight first."""
    spec = {
        "kind": "eval",
        "eval": {"target": setup["target"], "drafter": setup["drafters"][name], "dtype": "float32"},
        "ground_truth": {"kind": "file", "path": setup["gt"]},
        "workdir": str(setup["root"] / "work"),
        "job_id": name,
        "feature_cache": False,
    }
    folder = setup["root"] / "work" / "jobs" / name
    log = run_eval_job(folder, spec)
    return json.loads((folder / "result.json").read_text()), log


def test_a_short_window_drafter_has_a_cliff_a_covering_one_none(setup):
    result, log = run(setup, "short")
    tau = {r["context"]: r["rate"] for r in result["metrics"]["tau_by_context"] if r["rounds"]}
    assert list(tau) == [0, 2048]
    line = result["metrics"]["context_cliff"]
    assert line.startswith("at context 2048: tau "), (line, tau)  # the first bucket past 512
    warnings = [i for i, e in enumerate(log) if e.get("event") == "warning"]
    loads = [i for i, e in enumerate(log) if e.get("event") in ("phase", "loading")]
    assert len(warnings) == 1 and warnings[0] < min(loads), log[:6]
    said = log[warnings[0]]["message"]
    assert "window is 512 positions" in said and f"reach {LONG + NEW} tokens" in said
    assert result["inputs"]["drafter_window"]["warning"] == said

    result, log = run(setup, "covering")
    covered = {r["context"]: r["rate"] for r in result["metrics"]["tau_by_context"] if r["rounds"]}
    assert result["metrics"]["context_cliff"].startswith("none: no bucket up to 2048"), covered
    assert not [e for e in log if e.get("event") == "warning"]
    assert result["inputs"]["drafter_window"]["warning"] is None
    assert covered[2048] > tau[2048]  # the covering drafter keeps its acceptance there
