"""`dflash remote-eval` over a real loopback sshd eval host on targets beyond the dense ones:
a tiny Qwen3.5-MoE VLM (hybrid Gated DeltaNet + attention, per-expert checkpoint keys that
transformers fuses on load, vision tower never loaded) and a tiny Gemma3 VLM (scaled
embeddings, sliding windows, tied head), each with a DFlash drafter trained for real on it.

The offline tau the host reports must equal online greedy speculative decoding round by
round: the oracle (`tests/helpers/oracle.py`) drives transformers' own model
(``from_pretrained``, the full VLM class) and re-runs it over the whole prefix each round.
Its completions are the ground truth the host evaluates (kind ``file``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from orchestrator.demo.architectures import Dims, save_tiny
from tests.helpers.cli import dflash
from tests.helpers.oracle import hf_model, online_rounds
from tests.helpers.sshd import ssh_host_entry

pytestmark = pytest.mark.slow
KINDS = ("qwen3_5_moe", "gemma3")
# hidden 64: drafter heads of 16; windows of 8 that a 34-token sequence crosses
DIMS = Dims(hidden=64, layers=4, vocab=256, max_positions=512, window=8)


@pytest.fixture(scope="module")
def setups(eval_sshd):
    """Per kind: target and trained drafter on the eval host, and the oracle's rounds."""
    from orchestrator.demo.train import make_ground_truth, train_drafter
    from remote.eval.drafter import load_drafter

    out = {}
    for kind in KINDS:
        root = eval_sshd.root / f"arch-{kind}"
        target = save_tiny(kind, root / "target", DIMS)
        rows = make_ground_truth(str(target), 8, prompt_len=10, completion_len=24, seed=1)
        step = train_drafter(
            str(target), str(root / "drafters"), save_steps=(120,), rows=rows, batch_samples=4
        )[0]
        model = hf_model(str(target))
        drafter, _ = load_drafter(step, torch.float32)
        oracle, gt = {}, []
        for row in rows[:4]:
            rounds, completion = online_rounds(
                model, drafter, row["prompt_ids"], len(row["completion_ids"]), recompute=True
            )
            oracle[row["id"]] = rounds
            gt.append(
                {"id": row["id"], "prompt_ids": row["prompt_ids"], "completion_ids": completion}
            )
        gt_file = root / "ground_truth.jsonl"
        gt_file.write_text("".join(json.dumps(r) + "\n" for r in gt))
        out[kind] = {
            "target": target,
            "drafters": Path(step).parent,
            "step": Path(step).name,
            "gt": gt_file,
            "oracle": oracle,
            "rows": rows,
        }
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_remote_eval_tau_equals_online_decoding(
    kind, setups, eval_sshd, ssh_base, make_inventory, tmp_path
):
    s = setups[kind]
    # the ground truth is the target's own greedy completion (transformers vs the engine)
    by_id = {r["id"]: r for r in s["rows"]}
    for line in s["gt"].read_text().splitlines():
        row = json.loads(line)
        assert row["completion_ids"] == by_id[row["id"]]["completion_ids"]
    inv = make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                roles={
                    "eval": {
                        "drafters": str(s["drafters"]),
                        "target_model": str(s["target"]),
                        "dtype": "float32",
                    }
                },
            )
        },
        defaults={"eval_host": "evalhost", "results_dir": str(tmp_path / "results")},
    )
    probe = dflash(
        "probe-structure",
        "--host",
        "evalhost",
        "--drafter",
        str(s["drafters"] / s["step"]),
        "--json",
        "-i",
        str(inv),
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout)
    assert report["drafter"]["ok"], report["drafter"]["problems"]
    proc = dflash(
        "remote-eval",
        "--checkpoint",
        s["step"],
        "--ground-truth",
        str(s["gt"]),
        "--ground-truth-kind",
        "file",
        "--samples",
        "4",
        "--budgets",
        "4",
        "--json",
        "-i",
        str(inv),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["inputs"]["target_layers"] == report["text"]["num_layers"]
    assert result["inputs"]["target_backbone"] == report["text"]["backbone"]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in samples) == sorted(s["oracle"])
    for rec in samples:
        assert rec["rounds"] == s["oracle"][rec["id"]], rec["id"]
    rounds = [r for rec in samples for r in rec["rounds"]]
    tau = sum(rounds) / len(rounds)
    assert result["metrics"]["tau_token_weighted"] == pytest.approx(tau)
    assert tau >= 1.3, f"the drafter accepts too little for the comparison to mean much: {tau}"
