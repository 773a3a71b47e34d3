"""`dflash parity` on two loopback sshd hosts with the same tiny Qwen3.5-style target (Gated
DeltaNet linear-attention layers and a full-attention layer), a drafter trained for real on
it, ground truth made once on B, A's capture streamed to B through the relay's data path."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.errors import DflashError
from orchestrator.eval.parity import run as parity
from orchestrator.inventory import load_inventory
from orchestrator.results import parity_view
from tests.helpers.checkpoints import without_tokenizer
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry

LAYERS = 6  # linear, linear, linear, full, linear, linear: depth enough to see growth


@functools.cache
def assets() -> tuple[str, str, str]:
    """(target folder, trained drafter folder, ground-truth JSONL: the target's own greedy
    completions the drafter trained on, so its tau is well above 1), built once per run."""
    from orchestrator.demo.models import build_qwen35_vl_target
    from orchestrator.demo.train import make_ground_truth, train_drafter

    root = tempfile.mkdtemp(prefix="dflash-parity-")
    target = build_qwen35_vl_target(f"{root}/qwen35", num_layers=LAYERS)
    rows = make_ground_truth(target, 12, prompt_len=10, completion_len=32, seed=1)
    steps = train_drafter(
        target,
        f"{root}/drafter",
        save_steps=(150,),
        rows=rows,
        target_layer_ids=[1, 4],
        batch_samples=4,
    )
    gt = Path(root) / "ground_truth.jsonl"
    gt.write_text("".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(rows)))
    return target, steps[-1], str(gt)


@pytest.fixture
def pair(trainer_sshd, eval_sshd, ssh_base, make_inventory, tmp_path):
    """Inventory: A = trainer, B = evalhost, both with the tiny target; the drafter and
    the ground-truth file on B (A gets B's selection from parity itself)."""
    target, drafter, gt = assets()
    drafters = eval_sshd.root / "drafters"
    drafters.mkdir(exist_ok=True)
    if not (drafters / "step-150").exists():
        shutil.copytree(drafter, drafters / "step-150")
    hosts = {}
    for name, server in (("trainer", trainer_sshd), ("evalhost", eval_sshd)):
        role = {
            "drafters": str(server.root / "drafters"),
            "target_model": target,
            "ground_truth": gt,
            "ground_truth_kind": "file",
            "threads": 1,
        }
        hosts[name] = ssh_host_entry(server, ssh_base, roles={"eval": role})
    path = make_inventory(hosts=hosts, defaults={"results_dir": str(tmp_path / "results")})
    return load_inventory(path)


def run(inv, **kw) -> dict:
    opts = parity.ParityOptions(samples=4, **kw)
    run_dir = parity.run_parity(inv, "trainer", "evalhost", opts)
    return parity_view.load(run_dir) | {"_dir": str(run_dir)}


def test_identical_hosts_give_exactly_zero(pair):
    r = run(pair, drafter="step-150", dtype_a="fp32", dtype_b="fp32")
    assert r["schema"] == "dflash.parity/1"
    assert r["hosts"] == {"a": "trainer", "b": "evalhost"}
    assert [x["layer"] for x in r["layers"]] == [1, 4]  # the drafter's target layers
    for x in r["layers"]:
        assert x["cosine"]["min"] == 1.0 and x["cosine"]["mean"] == 1.0
        assert x["rel_l2"]["max"] == 0.0 and x["max_abs"]["max"] == 0.0
    assert r["identical"] is True
    assert r["top1_agreement"]["rate"] == 1.0
    d = r["drafter"]
    assert d["delta_tau"] == 0.0 and d["tau_a"] == d["tau_b"] > 1.0
    assert all(s["first_diverging_round"] is None for s in d["per_sample"])
    # recorded: devices, dtypes, kernels, versions; the transfer was verified
    cap = r["captures"]["a"]
    assert cap["device"]["device"] == "cpu" and cap["dtype"] == "float32"
    assert set(cap["kernels"]) == {"fla", "causal_conv1d"}
    assert cap["environment"]["torch"]
    assert r["transfer"]["sha256_verified"] and r["transfer"]["files"] == 5  # json + 4


def test_bf16_vs_fp32_error_grows_with_depth_and_tau_is_measured(pair):
    r = run(pair, drafter="step-150", layers=list(range(LAYERS)), dtype_a="fp32", dtype_b="bf16")
    rel = [x["rel_l2"]["p50"] for x in r["layers"]]
    assert all(e > 0 for e in rel), rel
    # bf16 rounding of the residual stream: ~1e-3 relative, never a broken model
    assert all(1e-4 < e < 0.1 for e in rel), rel
    assert all(x["cosine"]["min"] > 0.99 and x["cosine"]["p50"] < 1.0 for x in r["layers"])
    # grows with depth: the deepest layer's error is several times the first's, and the
    # second half of the stack is worse than the first half
    assert rel[-1] > 2 * rel[0], rel
    assert sum(rel[LAYERS // 2 :]) > sum(rel[: LAYERS // 2]), rel
    assert r["identical"] is False
    d = r["drafter"]
    assert d["tau_a"] > 1.0 and d["tau_b"] > 1.0
    assert d["delta_tau"] == pytest.approx(d["tau_b"] - d["tau_a"])
    assert isinstance(d["delta_tau"], float)
    for s in d["per_sample"]:
        fd = s["first_diverging_round"]
        assert fd is None or s["rounds_a"][:fd] == s["rounds_b"][:fd]
    print(
        f"\nbf16 vs fp32: relL2 p50 by layer {[f'{e:.2e}' for e in rel]}, tau A "
        f"{d['tau_a']:.4f}, tau B {d['tau_b']:.4f}, delta {d['delta_tau']:+.4f}, "
        f"diverging {d['samples_diverging']}/{len(d['per_sample'])}"
    )
    png = Path(r["_dir"]) / "parity_layers.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


def test_sdpa_vs_eager_differ_only_from_the_first_attention_layer(pair):
    r = run(
        pair,
        layers=list(range(LAYERS)),
        dtype_a="fp32",
        dtype_b="fp32",
        attn_a="sdpa",
        attn_b="eager",
    )
    by = {x["layer"]: x for x in r["layers"]}
    # Gated DeltaNet layers do not use the attention implementation: bit-identical before
    # layer 3, the first full-attention layer; from there on the two kernels' rounding.
    assert all(by[i]["identical"] for i in (0, 1, 2))
    assert not by[3]["identical"] and by[3]["max_abs"]["max"] > 0
    assert all(0 < by[i]["rel_l2"]["max"] < 1e-4 for i in (3, 4, 5))
    assert r["captures"]["a"]["attn"] == "sdpa" and r["captures"]["b"]["attn"] == "eager"
    assert "drafter" not in r


def test_cli_parity_results_list_show_and_cuda_error(pair, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    inv = str(pair.path)
    cli = CliRunner()
    out = cli.invoke(
        app,
        [
            "parity",
            "--hosts",
            "trainer,evalhost",
            "--samples",
            "2",
            "--layers",
            "0-1",
            "--dtype-a",
            "fp32",
            "--dtype-b",
            "bf16",
            "-i",
            inv,
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["summary"]["kind"] == "parity" and doc["summary"]["identical"] is False
    listed = cli.invoke(app, ["results", "list", "-i", inv, "--json"])
    assert listed.exit_code == 0, listed.output
    assert doc["run_id"] in [r["run_id"] for r in json.loads(listed.stdout)]
    shown = cli.invoke(app, ["results", "show", doc["run_id"], "-i", inv])
    assert shown.exit_code == 0, shown.output
    assert "features per layer" in shown.stdout and "relL2 p99" in shown.stdout
    # the compare job is a detached job: attach pulls its result again
    again = cli.invoke(
        app,
        [
            "jobs",
            "attach",
            doc["run_id"],
            "--host",
            "evalhost",
            "-i",
            inv,
            "--results-dir",
            str(pair.path.parent / "again"),
        ],
    )
    assert again.exit_code == 0, again.output
    assert (pair.path.parent / "again" / doc["run_id"] / "parity_layers.png").is_file()
    # cuda asked where torch sees no GPU: one line naming the problem and the fix
    with pytest.raises(DflashError) as exc:
        parity.run_parity(
            pair, "trainer", "evalhost", parity.ParityOptions(samples=1, device_b="cuda")
        )
    msg = str(exc.value)
    assert "device cuda asked but torch" in msg and "sees no GPU" in msg
    assert "--device cpu" in msg and "\n" not in msg
    with pytest.raises(DflashError, match="device 'tpu' is not supported"):
        parity.ParityOptions(device_a="tpu")


def test_engine_device_option_one_path_and_clear_errors(tmp_path):
    """`remote-eval --device` reaches the engine's spec through the job; cuda where torch
    sees no GPU is one line before anything loads; a bad name is refused by form."""
    import torch

    from remote.errors import UserError
    from remote.eval import device, preflight
    from remote.eval import engine as evaluate
    from remote.eval import job as jobs

    assert str(device.resolve(None)) == "cpu" and str(device.resolve("cpu")) == "cpu"
    spec = {
        "target": "/t",
        "drafter": "/d",
        "ground_truth": "/g",
        "output_dir": "/o",
        "device": "cuda:1",
    }
    (tmp_path / "s.json").write_text(json.dumps(spec))
    assert evaluate.read_spec(str(tmp_path / "s.json")).device == "cuda:1"
    (tmp_path / "s.json").write_text(json.dumps(spec | {"device": "gpu0"}))
    with pytest.raises(UserError, match="device 'gpu0' is not supported; use cpu, cuda"):
        evaluate.read_spec(str(tmp_path / "s.json"))
    job = {"eval": {"target": "/t", "drafter": "/d", "dtype": "float32", "device": "cuda"}}
    assert jobs.build_eval_spec(tmp_path, jobs.job_engine(job), "/g").device == "cuda"
    if not torch.cuda.is_available():
        for run in (
            lambda: device.resolve("cuda"),
            lambda: preflight.check({"eval": {"device": "cuda", "target": "/t"}}),
        ):
            with pytest.raises(UserError) as exc:
                run()
            assert "device cuda asked but torch" in str(exc.value)
            assert "sees no GPU" in str(exc.value) and "\n" not in str(exc.value)


# ---- before any capture: both hosts checked, the targets compared ----------------------


def host_jobs(server) -> set[str]:
    """The job folders on a loopback host (its workdir is ``<root>/dflash``)."""
    root = server.root / "dflash" / "jobs"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def split_inventory(make_inventory, trainer_sshd, eval_sshd, ssh_base, results, **trainer):
    """As the shipped inventory has them: A a trainer with no eval role (its target comes
    from --model-a), B the eval host with the drafter, its ground truth a file and its
    evals in float32. `trainer`: more keys of A's entry (e.g. ``python``)."""
    target, drafter, gt = assets()
    drafters = eval_sshd.root / "drafters"
    drafters.mkdir(exist_ok=True)
    if not (drafters / "step-150").exists():
        shutil.copytree(drafter, drafters / "step-150")
    ckpts = trainer_sshd.root / "checkpoints"
    ckpts.mkdir(exist_ok=True)
    role = {"checkpoints": str(ckpts)}
    return make_inventory(
        hosts={
            "trainer": ssh_host_entry(trainer_sshd, ssh_base, roles={"trainer": role}, **trainer),
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                roles={
                    "eval": {
                        "drafters": str(drafters),
                        "target_model": target,
                        "ground_truth": gt,
                        "ground_truth_kind": "file",
                        "dtype": "float32",
                        "threads": 1,
                    }
                },
            ),
        },
        defaults={"results_dir": str(results)},
    )


def test_both_hosts_and_both_targets_are_checked_before_any_capture(
    trainer_sshd, eval_sshd, ssh_base, make_inventory, tmp_path, tiny_target
):
    """Issue 24.9 and 25.10: parity used to capture on B for seconds before finding A had no
    target, then that A's python had no torch; and it compared a Qwen3 target with a
    Qwen3.5 one as if numerics (exit 0, cos 0.02, a delta tau). Each is now one line and a
    non-zero exit before anything is captured: no job on either host."""
    target = assets()[0]
    inv = str(split_inventory(make_inventory, trainer_sshd, eval_sshd, ssh_base, tmp_path / "r"))
    before = (host_jobs(trainer_sshd), host_jobs(eval_sshd))

    def refused(*args: str, inventory: str = inv) -> str:
        proc = dflash("parity", "--hosts", "trainer,evalhost", *args, "-i", inventory, timeout=300)
        assert proc.returncode != 0, proc.stdout
        return one_error_line(proc)

    line = refused()
    assert "no target model for host trainer" in line and "--model-a" in line
    # A different checkpoint on A (the session's tiny Qwen3 against B's Qwen3.5)
    line = refused("--model-a", str(tiny_target))
    assert "targets on trainer and evalhost are not the same checkpoint" in line, line
    assert "Qwen3ForCausalLM" in line and "Qwen3_5ForConditionalGeneration" in line
    assert "--allow-different-targets" in line
    # B's target without its tokenizer, where B makes the ground truth from text prompts
    notok = without_tokenizer(Path(target), eval_sshd.root / "parity-no-tokenizer")
    line = refused("--model-a", target, "--model-b", str(notok), "--ground-truth-kind", "local")
    assert f"evalhost: target folder {notok} has no tokenizer" in line, line
    # A's python has no torch: a bare virtual environment
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    no_torch = split_inventory(
        make_inventory, trainer_sshd, eval_sshd, ssh_base, tmp_path / "r",
        python=str(bare / "bin" / "python"),
    )  # fmt: skip
    line = refused("--model-a", target, inventory=str(no_torch))
    assert line.startswith("error: trainer: ") and "torch" in line and "not installed" in line
    assert (host_jobs(trainer_sshd), host_jobs(eval_sshd)) == before


def test_both_hosts_compute_in_one_dtype_unless_asked(
    trainer_sshd, eval_sshd, ssh_base, make_inventory, tmp_path
):
    """Issue 24.9: A without an eval role computed in the default bfloat16 while B's role
    said float32, silently. Both now compute in B's dtype unless asked otherwise."""
    target = assets()[0]
    results = tmp_path / "results"
    inv = str(split_inventory(make_inventory, trainer_sshd, eval_sshd, ssh_base, results))
    out = dflash(
        "parity", "--hosts", "trainer,evalhost", "--model-a", target, "--samples", "1",
        "--layers", "0", "-i", inv, "--json", timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)["result"]
    assert result["captures"]["a"]["dtype"] == result["captures"]["b"]["dtype"] == "float32"


def test_jobs_lists_the_jobs_of_every_host_a_trainer_included(two_hosts):
    """Issue 24.13: `dflash jobs` asked eval hosts only, so a parity capture on the trainer
    (no eval role) showed only with --host trainer. A real capture job runs there (and
    fails at once: its target is not there); the plain listing shows it."""
    import time

    from orchestrator.eval import job as remote_job
    from orchestrator.eval.spec import new_job_id
    from orchestrator.transport.hosts import open_host

    inv = load_inventory(two_hosts)
    assert inv.hosts["trainer"].eval is None
    spec = {"kind": "parity-capture", "checkpoint": "parity-a", "eval": {"target": "/none"}}
    with open_host(inv.hosts["trainer"], inv) as host:
        ref = remote_job.start_job(host, spec, new_job_id("parity-a"))
        deadline = time.monotonic() + 120  # a hang guard
        while remote_job.job_status(host, ref.job_id)["state"] in ("starting", "running"):
            assert time.monotonic() < deadline, "the job never ended"
            time.sleep(0.2)
    listed = dflash("jobs", "-i", str(two_hosts), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {(r["host"], r["job_id"]): r for r in json.loads(listed.stdout)}
    row = rows[("trainer", ref.job_id)]
    assert row["kind"] == "parity-capture" and row["state"] == "failed"
    assert "/none does not exist" in row["exit"]["error"]


def test_target_difference_tells_copies_from_other_checkpoints(tmp_path, tiny_target):
    """The identity the preflight reports (config and text weights, from the one model
    reader) is the same for copies of one checkpoint, stored in another dtype too, and
    names what differs otherwise."""
    import torch

    from remote.model.load import plan_text
    from remote.probe.identity import target_identity

    target = Path(assets()[0])
    bf16 = tmp_path / "bf16"
    shutil.copytree(target, bf16)
    cfg = json.loads((bf16 / "config.json").read_text())
    cfg["_name_or_path"], cfg["dtype"] = "elsewhere", "bfloat16"
    (bf16 / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    sd = load_file(str(bf16 / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, str(bf16 / "model.safetensors"))
    edited = tmp_path / "edited"
    shutil.copytree(target, edited)
    cfg = json.loads((edited / "config.json").read_text())
    cfg["text_config"]["rms_norm_eps"] = 1e-3
    (edited / "config.json").write_text(json.dumps(cfg))

    def ident(folder) -> dict:
        return target_identity(*plan_text(folder, torch.float32))

    base = ident(target)
    assert parity.target_difference(base, ident(bf16)) is None
    assert ident(bf16)["dtypes"] == {"BF16": base["weights"]["tensors"]}
    diff = parity.target_difference(base, ident(edited))
    assert diff and "their text configs differ in rms_norm_eps" in diff
    assert "weights differ" not in diff
    diff = parity.target_difference(ident(tiny_target), base)
    assert "A has Qwen3ForCausalLM" in diff and "B Qwen3_5ForConditionalGeneration" in diff
    assert "their text weights differ in names or shapes" in diff
    # what a host answers is any JSON: never a traceback, never a second line
    hostile = {"architecture": "X\nY", "config": [1], "weights": "w", "text": 3}
    diff = parity.target_difference(hostile, base)
    assert diff.startswith("A has X Y (None layers") and "\n" not in diff
    assert parity.target_difference([], base) is None
