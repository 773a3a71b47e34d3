"""The demo trainer's options the benchmarks shape and stop drafters with
(`orchestrator.demo.train.train_drafter`)."""

from __future__ import annotations

import json
import os


def test_the_trainer_shapes_the_mlp_and_stops_at_the_checkpoint_until_accepts(
    tiny_target, tmp_path
):
    from orchestrator.demo.train import train_drafter

    seen = []

    def until(path: str) -> bool:
        seen.append(os.path.basename(path))
        return path.endswith("step-2")

    paths = train_drafter(
        str(tiny_target),
        str(tmp_path / "d"),
        save_steps=(0, 2, 4),
        samples=2,
        completion_len=8,
        intermediate_size=96,
        until=until,
    )
    assert [os.path.basename(p) for p in paths] == seen == ["step-0", "step-2"]
    assert not (tmp_path / "d" / "step-4").exists()  # no training past the accepted one
    cfg = json.loads((tmp_path / "d" / "step-2" / "config.json").read_text())
    assert cfg["intermediate_size"] == 96
