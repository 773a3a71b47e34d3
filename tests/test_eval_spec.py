"""The eval spec's one path: command-line values -> ONE `EvalSpec` (checked before anything
connects) -> the job document (`to_json`, under ``eval``) -> the host (`from_json`, once)
-> the engine, with the host's inventory role filling only what the caller did not choose."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.eval.spec import EvalOptions, engine_spec
from orchestrator.inventory import EvalRole
from remote.errors import UserError
from remote.eval import job as jobs
from remote.protocol import DEFAULT_BUDGETS, JOB_ENGINE_DEFAULT, EvalSpec


@pytest.mark.parametrize(
    "given,message",
    [
        ({"dtype": "fp16"}, "dtype 'fp16' is not supported; use bfloat16 (bf16) or float32"),
        ({"positions": "some"}, 'positions \'some\' is not supported; use "all" or "walk"'),
        ({"device": "tpu"}, "device 'tpu' is not supported; use cpu, cuda or cuda:N"),
        ({"budgets": [8, 0]}, "budgets must be whole numbers of at least 1, got 8,0"),
        ({"threads": 0}, "threads must be a whole number of at least 1, got 0"),
        ({"topk": -1}, "topk must be a whole number of at least 1, got -1"),
    ],
)
def test_a_bad_engine_setting_is_one_line_before_anything_runs(given, message):
    with pytest.raises(DflashError) as exc:
        engine_spec(**given)
    assert str(exc.value).startswith(message)
    assert "\n" not in str(exc.value)


def test_given_settings_are_normalised_once_and_the_rest_are_the_job_defaults():
    engine, chosen = engine_spec(dtype="bf16", budgets=[32, 8, 8], threads=None, topk=None)
    assert engine.dtype == "bfloat16" and engine.budgets == (8, 32)
    assert chosen == {"dtype", "budgets"}
    assert engine_spec()[0] == JOB_ENGINE_DEFAULT
    assert JOB_ENGINE_DEFAULT.budgets == DEFAULT_BUDGETS


def test_the_inventory_role_fills_only_what_the_caller_did_not_choose():
    role = EvalRole(drafters="/d", dtype="float32", threads=3)
    # nothing chosen: the role's dtype and threads
    assert EvalOptions().engine_for(role).dtype == "float32"
    assert EvalOptions().engine_for(role).threads == 3
    # an explicit bfloat16 wins over the role's float32, though it equals the default
    engine, chosen = engine_spec(dtype="bfloat16", budgets=[4])
    resolved = EvalOptions(engine=engine, chosen=chosen).engine_for(role)
    assert (resolved.dtype, resolved.threads, resolved.budgets) == ("bfloat16", 3, (4,))
    # a library caller's EvalSpec: what differs from the job defaults counts as chosen
    lib = EvalOptions(engine=EvalSpec(budgets=(2, 4), threads=1)).engine_for(role)
    assert (lib.dtype, lib.threads, lib.budgets) == ("float32", 1, (2, 4))
    assert EvalOptions().engine_for(None) == JOB_ENGINE_DEFAULT


def test_the_job_carries_the_spec_whole_and_the_host_reads_it_back_unchanged(tmp_path):
    engine = EvalSpec(
        target="/t",
        drafter="/d",
        dtype="float32",
        threads=2,
        budgets=(8, 16),
        topk=3,
        positions="all",
        device="cuda:1",
    )
    job = {"kind": "eval", "samples": 4, "eval": engine.to_json()}
    read = jobs.job_engine(job)
    assert read == engine
    ran = jobs.build_eval_spec(tmp_path, read, "/g.jsonl")
    assert ran.ground_truth == "/g.jsonl" and ran.output_dir == str(tmp_path)
    assert ran.to_json() | {"ground_truth": "", "output_dir": ""} == engine.to_json()


def test_a_bad_spec_in_a_job_is_one_line_on_the_host():
    for bad, word in (
        ({"eval": {"dtype": "fp16"}}, "dtype 'fp16'"),
        ({"eval": {"budget": [8]}}, "unknown keys budget"),
        ({"eval": {"budgets": "8"}}, "budgets must be a list"),
    ):
        with pytest.raises(UserError) as exc:
            jobs.job_engine(bad)
        assert str(exc.value).startswith("job spec: ") and word in str(exc.value)
        assert "\n" not in str(exc.value)


def test_eval_identity_is_what_changes_a_result_not_its_speed():
    """Two job specs are one evaluation (``follow`` records a run of it instead of running
    it again) when only the time, id, workdir or speed settings differ; any setting of the
    result makes them two; a pulled spec that is not a job document is no match, never an
    error."""
    from orchestrator.eval.spec import eval_identity

    job = {
        "kind": "eval",
        "host": "h",
        "checkpoint": "step-1",
        "samples": 4,
        "seed": 0,
        "sampling": {"temperature": 0.0, "max_new_tokens": 8},
        "ground_truth": {"kind": "sglang", "url": "http://x", "timeout": 300, "concurrency": 16},
        "prompts": {"path": "~/.dflash/prompts/ab-chat.jsonl", "sha256": "ab", "name": "chat"},
        "eval": {**JOB_ENGINE_DEFAULT.to_json(), "target": "/t", "drafter": "/d/step-1"},
    }
    later = {
        **job,
        "created": 2.0,
        "job_id": "j2",
        "workdir": "/home/u/.dflash",
        "prompts": {**job["prompts"], "path": "/home/u/.dflash/prompts/ab-chat.jsonl"},
        "ground_truth": {**job["ground_truth"], "timeout": 60, "concurrency": 2},
        "eval": {**job["eval"], "threads": 8, "block_chunk": 4, "output_dir": "/o"},
    }
    assert eval_identity(later) == eval_identity(job)
    for other in (
        {**job, "samples": 5},
        {**job, "sampling": {"temperature": 0.0, "max_new_tokens": 9}},
        {**job, "eval": {**job["eval"], "dtype": "float32"}},
        {**job, "eval": {**job["eval"], "budgets": [4]}},
        {**job, "prompts": {**job["prompts"], "sha256": "cd"}},
        {**job, "ground_truth": {**job["ground_truth"], "url": "http://y"}},
    ):
        assert eval_identity(other) != eval_identity(job)
    junk = {"eval": [1], "prompts": "x", "ground_truth": 3}
    assert eval_identity(junk) != eval_identity(job)


# A valid value, other than the default, of each job setting an eval role sets.
ROLE_VALUES = {"feature_cache_gib": 2.5, "nice": 5}


def test_a_job_setting_an_eval_role_sets_is_declared_once_and_carried(tmp_path):
    """A job setting the contract marks as an eval role's (`JobSpec.ROLE_SETTINGS`) is read
    from ``roles.eval`` with the contract's own check and reaches the job document built
    for that host, and the host's reading of it; without the role it is the default."""
    from orchestrator.eval.spec import build_spec
    from orchestrator.inventory import InventoryError, parse_inventory
    from orchestrator.transport.hosts import open_host
    from remote.protocol import JobSpec

    assert set(ROLE_VALUES) == set(JobSpec.ROLE_SETTINGS)

    def inventory(role: dict):
        settings = "".join(f", {k}: {v}" for k, v in role.items())
        text = (
            f"hosts:\n  h:\n    transport: local\n    workdir: {tmp_path}\n    roles:\n"
            f"      eval: {{drafters: /d, target_model: /t, ground_truth: 'http://x:1'"
            f"{settings}}}\n"
        )
        return parse_inventory(text, tmp_path / "inv.yaml")

    def job(inv, **options):
        spec = inv.hosts["h"]
        with open_host(spec, inv) as host:
            return build_spec(host, spec, "/d/step-1", EvalOptions(**options), carry=[])

    inv = inventory(ROLE_VALUES)
    built = job(inv)
    assert {k: built[k] for k in ROLE_VALUES} == ROLE_VALUES
    read = JobSpec.from_json(built)
    assert {k: getattr(read, k) for k in ROLE_VALUES} == ROLE_VALUES
    bare = inventory({})
    bare.hosts["h"].eval = None
    built = job(bare, target="/t", ground_truth="http://x:1")
    assert {k: built[k] for k in ROLE_VALUES} == JobSpec.ROLE_SETTINGS
    for name in ROLE_VALUES:
        with pytest.raises(InventoryError) as bad:
            inventory({name: "[1]"})
        expected = JobSpec.CHECKS[name].expected
        assert f"hosts.h.roles.eval.{name}: expected {expected}" in str(bad.value)


def test_an_eval_roles_nice_runs_the_job_runner_nicer(tmp_path):
    """``roles.eval.nice: 5``: the host's job runner (a detached ``job run``) starts with 5
    added to its niceness, as the kernel reports it; a bad value is one line at the job's
    start and nothing is made."""
    import json
    import os
    import time

    from orchestrator.eval.job import start_job
    from orchestrator.eval.spec import build_spec
    from orchestrator.inventory import parse_inventory
    from orchestrator.transport.hosts import open_host
    from remote.jobs import start as jobs

    text = (
        f"hosts:\n  h:\n    transport: local\n    workdir: {tmp_path}\n    roles:\n"
        "      eval: {drafters: /nowhere, target_model: /nowhere, ground_truth_kind: local,"
        " nice: 5}\n"
    )
    inv = parse_inventory(text, tmp_path / "inv.yaml")
    spec = inv.hosts["h"]
    with open_host(spec, inv) as host:
        ref = start_job(host, build_spec(host, spec, "step-1", EvalOptions()))
    ran = json.loads((Path(ref.dir) / "pid.json").read_text())
    assert ran["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    for _ in range(600):  # the runner fails (no target there): let it end before cleanup
        if (Path(ref.dir) / "exit.json").is_file():
            break
        time.sleep(0.1)
    with pytest.raises(UserError, match=r"^job spec: nice must be a whole number from 0 to"):
        jobs.start(str(tmp_path), "j2", {"kind": "eval", "nice": -5})
    assert not (tmp_path / "jobs" / "j2").exists()


def test_no_ground_truth_configured_the_target_makes_it_and_a_note_says_so(tmp_path):
    """No ground truth configured (no server, no kind; #48): before, the eval stopped with
    "ground truth kind 'sglang' needs a server URL", a kind nobody chose. The target now
    makes it on the eval host (kind local) and the request carries one note saying so and
    how to use a server; a server URL alone is asked as the default server kind, and a
    server kind chosen without a URL is one line naming the other way."""
    from orchestrator.eval.request import eval_request
    from orchestrator.eval.spec import build_spec
    from orchestrator.inventory import parse_inventory
    from orchestrator.transport.hosts import open_host
    from remote.protocol import DEFAULT_SERVER_KIND

    def inventory(role: str):
        text = (
            f"hosts:\n  box:\n    transport: local\n    workdir: {tmp_path}\n    roles:\n"
            f"      eval: {{drafters: /d, target_model: /t{role}}}\n"
        )
        return parse_inventory(text, tmp_path / "inv.yaml")

    def kind(inv, **options) -> str:
        spec = inv.hosts["box"]
        with open_host(spec, inv) as host:
            job = build_spec(host, spec, "step-1", EvalOptions(**options), carry=[])
        return job["ground_truth"]["kind"]

    bare = inventory("")
    (note,) = eval_request(bare, "step-1").notes
    assert "\n" not in note and note.startswith("no ground truth configured for box:")
    assert "ground_truth_kind local" in note and "roles.eval.ground_truth to a server URL" in note
    assert eval_request(bare, "step-1", hosts="box").notes == [note]
    assert kind(bare) == "local"
    assert kind(bare, ground_truth="http://127.0.0.1:1") == DEFAULT_SERVER_KIND
    assert eval_request(bare, "step-1", EvalOptions(ground_truth_kind="local")).notes == []
    served = inventory(", ground_truth: 'http://127.0.0.1:1'")
    assert eval_request(served, "step-1").notes == [] and kind(served) == DEFAULT_SERVER_KIND
    with pytest.raises(DflashError) as chosen:
        kind(bare, ground_truth_kind="openai")
    line = str(chosen.value)
    assert "kind 'openai' needs a server URL" in line and "ground_truth_kind local" in line
