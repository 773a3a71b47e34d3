"""`dflash remote-eval` over a real loopback sshd eval host on targets beyond the dense ones:
a tiny Qwen3.5-MoE VLM (hybrid Gated DeltaNet + attention, per-expert checkpoint keys that
transformers fuses on load, vision tower never loaded) and a tiny Gemma3 VLM (scaled
embeddings, sliding windows, tied head), each with a DFlash drafter trained for real on it.

The offline tau the host reports must equal online greedy speculative decoding round by
round: the oracle (`tests/test_eval_engine.online_rounds`) drives transformers' own model
(``from_pretrained``, the full VLM class) and re-runs it over the whole prefix each round.
Its completions are the ground truth the host evaluates (kind ``file``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import dflash
from tests.helpers.oracle import hf_model, online_rounds
from tests.helpers.sshd import ssh_host_entry

pytestmark = pytest.mark.slow
KINDS = ("qwen3_5_moe", "gemma3")


def build_target(kind: str, folder: Path) -> Path:
    """A tiny target of `kind` with hidden 64 (drafter heads of 16), saved as users save."""
    import transformers

    torch.manual_seed(0)
    text = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    if kind == "qwen3_5_moe":
        text.update(
            num_hidden_layers=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
        )
        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=4,
            out_hidden_size=64,
            num_position_embeddings=16,
        )
        model = transformers.Qwen3_5MoeForConditionalGeneration(
            transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision)
        )
    else:
        text.update(
            num_hidden_layers=4,
            intermediate_size=128,
            sliding_window=8,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
        )
        text.pop("tie_word_embeddings")  # Gemma ties its head: the checkpoint lacks lm_head
        vision = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=4,
        )
        model = transformers.Gemma3ForConditionalGeneration(
            transformers.Gemma3Config(
                text_config=transformers.Gemma3TextConfig(**text),
                vision_config=transformers.SiglipVisionConfig(**vision),
                mm_tokens_per_image=4,
                image_token_index=255,
                boi_token_index=253,
                eoi_token_index=254,
            )
        )
    model.eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def setups(eval_sshd):
    """Per kind: target and trained drafter on the eval host, and the oracle's rounds."""
    from orchestrator.demo.train import make_ground_truth, train_drafter
    from remote.eval.drafter import load_drafter

    out = {}
    for kind in KINDS:
        root = eval_sshd.root / f"arch-{kind}"
        target = build_target(kind, root / "target")
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
