"""A context ladder end to end (#51): `dflash remote-eval --context-ladder` over a real
loopback sshd eval host, the tiny real target's ground truth made by a real ground-truth
server, two drafter checkpoints trained for real; tau per context bucket in every view
(the result's JSON, `results show`, the CSV export, `results compare`), and the drafter's
window warned about, before anything loads, for the one checkpoint whose window the
ladder passes; a ladder of 1k to 16k on a target built as the demo's are (window 32768);
and `dflash online` on a ladder, its engine's max_model_len from the longest context."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from remote.protocol.ladder import RUNG_OVER
from tests.helpers.cli import dflash
from tests.helpers.sshd import eval_host_inventory

pytestmark = pytest.mark.slow

RUNGS = "1k,2k"  # buckets 1024 and 2048
NEW = 8


@pytest.fixture(scope="module")
def drafters(eval_sshd, tiny_target):
    """Two checkpoints of a tiny drafter trained for real; the second's window narrowed to
    2048 positions, which the ladder's top rung passes."""
    from orchestrator.demo.train import train_drafter

    folder = eval_sshd.root / "ladder-drafters"
    train_drafter(str(tiny_target), str(folder), save_steps=(0, 12), samples=6, batch_samples=3)
    cfg = folder / "step-12" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "max_position_embeddings": 2048}))
    return folder


def role(drafters: Path, target: Path, server) -> dict:
    """The eval host's role: these drafters on the tiny target, ground truth from `server`."""
    return {
        "drafters": str(drafters),
        "target_model": str(target),
        "ground_truth": server.url,
        "ground_truth_kind": "sglang",
        "dtype": "float32",
    }


def test_a_ladder_runs_end_to_end_with_tau_per_bucket_in_every_view(
    eval_sshd, ssh_base, make_inventory, tiny_target, drafters, server, tmp_path
):
    inv = eval_host_inventory(
        make_inventory, eval_sshd, ssh_base, role(drafters, tiny_target, server), tmp_path / "res"
    )
    runs = {}
    for step in ("step-0", "step-12"):
        got = dflash(
            "remote-eval", "--checkpoint", step, "--prompts", "gsm8k", "--samples", "2",
            "--max-new-tokens", str(NEW), "--context-ladder", RUNGS, "-i", str(inv), "--json",
            timeout=600,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        runs[step] = json.loads(got.stdout)
        warned = [ln for ln in got.stderr.splitlines() if "drafter's window" in ln]
        if step == "step-0":
            assert warned == [], got.stderr  # its window, the target's 32768, covers it
        else:  # one line, before the ground truth and any weights, naming both numbers
            (line,) = warned
            assert "window is 2048 positions" in line
            assert f"reach {2 * 1024 + RUNG_OVER + NEW} tokens" in line
            # after "started" and the outline, before the job's notes and any progress
            assert got.stderr.splitlines().index(line) == 2, got.stderr
    asked = len(server.requests)
    assert asked > 6  # the history's answers and the ladder's completions, made once

    results = {}
    for step, out in runs.items():
        result = json.loads((Path(out["run_dir"]) / "result.json").read_text())
        results[step] = result
        rows = {r["context"]: r for r in result["metrics"]["tau_by_context"]}
        assert [c for c, r in rows.items() if r["rounds"]] == [1024, 2048]
        assert result["metrics"]["context_cliff"]
        window = result["inputs"]["drafter_window"]
        assert (window["warning"] is None) == (step == "step-0"), window
    ids = [json.loads(ln)["id"] for ln in (Path(runs["step-12"]["run_dir"]) / "samples.jsonl")
           .read_text().splitlines()]  # fmt: skip
    assert sorted(i.split("@")[1] for i in ids) == ["1k", "1k", "2k", "2k"]

    a, b = (runs[s]["summary"]["run_id"] for s in ("step-0", "step-12"))
    want = {r["context"]: r["rate"] for r in results["step-12"]["metrics"]["tau_by_context"]}
    show = dflash("results", "show", b, "-i", str(inv))
    assert show.returncode == 0, show.stderr
    assert "tau by context" in show.stdout and "window is 2048" in show.stdout
    for c in (1024, 2048):
        assert re.search(rf"^\W*{c}\W+\d+\W+\d+\W+{want[c]:.3f}\W*$", show.stdout, re.M), c
    shown = json.loads(dflash("results", "show", b, "-i", str(inv), "--json").stdout)
    assert shown["metrics"]["tau_by_context"] == results["step-12"]["metrics"]["tau_by_context"]
    assert shown["inputs"]["drafter_window"]["warning"]

    exported = dflash("results", "export", "-f", "csv", b, "-i", str(inv))
    assert exported.returncode == 0, exported.stderr
    (row,) = csv.DictReader(io.StringIO(exported.stdout))
    for c in (1024, 2048):
        assert float(row[f"tau_by_context_{c}"]) == pytest.approx(want[c], abs=1e-6)

    compared = dflash("results", "compare", a, b, "-i", str(inv), "--json")
    assert compared.returncode == 0, compared.stderr
    (paired,) = json.loads(compared.stdout)["paired"]
    per = {g["name"] for g in paired["groups"] if g["axis"] == "context"}
    assert per == {"1024", "2048"}
    table = dflash("results", "compare", a, b, "-i", str(inv))
    assert "tau by context" in table.stdout and re.search(r"^\W*2048\s", table.stdout, re.M)
    assert len(server.requests) == asked  # views read what was pulled


def test_a_ladder_to_16k_runs_end_to_end_on_a_demo_built_target(
    eval_sshd, ssh_base, make_inventory, tiny_target, drafters, server, tmp_path
):
    """1k to 16k on the tiny Qwen3 target, one question a rung: tau in every bucket up to
    16384 in the JSON, `results show`, the CSV and the HTML report; the drafter's window
    (the target's, 32768, though it was trained on short samples) covers it: no warning."""
    inv = eval_host_inventory(
        make_inventory, eval_sshd, ssh_base, role(drafters, tiny_target, server), tmp_path / "res"
    )
    got = dflash(
        "remote-eval", "--checkpoint", "step-0", "--prompts", "gsm8k", "--samples", "1",
        "--max-new-tokens", "4", "--context-ladder", "1k,2k,4k,8k,16k", "-i", str(inv),
        "--json", timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert "drafter's window" not in got.stderr, got.stderr
    run_id = json.loads(got.stdout)["summary"]["run_id"]
    result = json.loads((Path(json.loads(got.stdout)["run_dir"]) / "result.json").read_text())
    want = {r["context"]: r["rate"] for r in result["metrics"]["tau_by_context"] if r["rounds"]}
    assert list(want) == [1024, 2048, 4096, 8192, 16384], result["metrics"]["tau_by_context"]
    window = result["inputs"]["drafter_window"]
    assert 16384 < window["longest_context"] <= 16384 + RUNG_OVER + 4 and not window["warning"]

    show = dflash("results", "show", run_id, "-i", str(inv))
    assert show.returncode == 0, show.stderr
    for c, rate in want.items():
        assert re.search(rf"^\W*{c}\W+\d+\W+\d+\W+{rate:.3f}\W*$", show.stdout, re.M), c
    (row,) = csv.DictReader(io.StringIO(dflash("results", "export", "-f", "csv", run_id,
                                                "-i", str(inv)).stdout))  # fmt: skip
    for c, rate in want.items():
        assert float(row[f"tau_by_context_{c}"]) == pytest.approx(rate, abs=1e-6)
    page = tmp_path / "report.html"
    made = dflash("results", "report", run_id, "-o", str(page), "-i", str(inv))
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    assert "tau by context" in html
    for c, rate in want.items():
        assert re.search(rf"<td[^>]*>{c}</td>.*?<td[^>]*>{rate:.3f}</td>", html), c


def test_online_runs_a_ladder_with_the_engines_window_from_its_longest_context(
    eval_sshd, ssh_base, make_inventory, tiny_target, drafters, server, tmp_path
):
    """`dflash online --context-ladder`: the job builds the ladder as remote-eval does,
    starts its serving engine (a stand-in answering as vLLM 0.32 does, from the host's
    ground-truth cache) with --max-model-len from the longest sample, and its verdict places
    each side's rounds and the walks' disagreements by context bucket."""
    from tests.helpers.scripted_vllm import stand_in

    python = stand_in(tmp_path / "stand-in-python", eval_sshd.root / "dflash" / "groundtruth")
    serve = {"engine": "vllm", "python": str(python), "kv_cache_gib": 1}
    online = {**role(drafters, tiny_target, server), "threads": 1, "serve": serve}
    inv = eval_host_inventory(make_inventory, eval_sshd, ssh_base, online, tmp_path / "res")
    got = dflash(
        "online", "-c", "step-0", "--prompts", "gsm8k", "--samples", "2",
        "--max-new-tokens", str(NEW), "--context-ladder", RUNGS, "-i", str(inv), "--json",
        timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    v, run_dir = out["verdict"], Path(out["run_dir"])
    rows = [json.loads(ln) for ln in (run_dir / "samples.jsonl").read_text().splitlines()]
    longest = max(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert 2048 < longest <= 2 * 1024 + RUNG_OVER + NEW
    # the engine's window: the longest sample, the last round's drafts and a margin
    assert v["server"]["max_model_len"] == longest + 3 + 16
    argv = json.loads(re.search(r"^argv: (.*)$", (run_dir / "server.log").read_text(), re.M)[1])
    assert argv[argv.index("--max-model-len") + 1] == str(longest + 3 + 16)
    by = {r["context"]: r for r in v["by_context"]}
    assert list(by) == [1024, 2048], v["by_context"]
    assert all(r["offline_rounds"] and r["online_rounds"] for r in by.values())
    diverged = [s["first_divergence"]["context"] for s in v["per_sample"]
                if s.get("first_divergence")]  # fmt: skip
    assert sum(r["diverged"] for r in by.values()) == len(diverged) > 0
    shown = dflash("results", "show", run_dir.name, "-i", str(inv))
    assert shown.returncode == 0, shown.stderr
    assert "tau by context, offline | online" in shown.stdout
    assert re.search(rf"engine max_model_len\W+{longest + 19}: ", shown.stdout), shown.stdout
