"""Shared, process-cached tiny models for the eval-engine tests (built once per test run).

Each kit is a real checkpoint folder of a real transformers architecture with a tokenizer,
plus drafters trained for real on the target's own greedy outputs (z-lab format, several
steps) and the training samples themselves.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass

import torch

torch.set_num_threads(1)  # tiny models: one thread is fastest and shares the box politely

ROOT = tempfile.mkdtemp(prefix="dflash-evalkit-")


@dataclass
class Kit:
    target: str
    steps: list[str]  # drafter checkpoints, training step ascending
    rows: list[dict]  # the target's greedy samples the drafter trained on


@functools.cache
def kit(kind: str) -> Kit:
    from orchestrator.demo.models import build_qwen3_target, build_qwen35_vl_target
    from orchestrator.demo.train import make_ground_truth, train_drafter

    target = f"{ROOT}/{kind}"
    (build_qwen3_target if kind == "qwen3" else build_qwen35_vl_target)(target)
    rows = make_ground_truth(target, 16, prompt_len=10, completion_len=32, seed=1)
    steps = train_drafter(
        target, f"{ROOT}/{kind}-drafter", save_steps=(0, 150), rows=rows, batch_samples=4
    )
    return Kit(target, steps, rows)
