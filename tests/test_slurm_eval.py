"""``remote-eval --hosts <login node>`` as ONE Slurm job array on the loopback cluster.

A real Slurm (`tests/helpers/slurm.py`: munged, slurmctld, two slurmd) behind a loopback
sshd as its login node; a tiny Qwen3 target and a drafter trained for real. The array's
tasks run the host-side eval job from the shared folder; the merged run must equal the
one-host eval sample by sample, and a task cancelled (``scancel``) or killed mid-run is
resubmitted and merged, or ends the run in one line, with nothing left queued.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.eval import run as remote_eval
from orchestrator.eval.job import JobError
from orchestrator.eval.shards import plan as shard_plan
from orchestrator.eval.shards import run as shard
from orchestrator.inventory import load_inventory
from orchestrator.results.store import results_dir
from orchestrator.slurm.role import SlurmError, SlurmRole
from remote.protocol import EvalSpec
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.slurm import MidRun, long_ground_truth, sampled_ground_truth, signal_mid_shard
from tests.helpers.sshd import ssh_host_entry


@pytest.fixture
def make_login(cluster, slurm_login, ssh_base, make_inventory, eval_role, tmp_path):
    """An inventory whose host ``login`` is the cluster's login node (its slurm role with
    `slurm` on top) and, with the same eval role (`sampling` on top), an ordinary eval
    host."""

    def write(sampling: dict | None = None, **slurm):
        shared = cluster.shared / tmp_path.name
        role = {"shared": str(shared), "mem_per_task": "256M", "poll_seconds": 0.3, **slurm}
        roles = {"slurm": role, "eval": eval_role(**(sampling or {}))}
        entry = ssh_host_entry(slurm_login, ssh_base, roles=roles)
        path = make_inventory(
            hosts={"login": entry},
            defaults={"eval_host": "login", "results_dir": str(tmp_path / "results")},
        )
        return path, shared

    return write


def _without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _samples(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


def _result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


PROMPTS = [
    "Hi.",
    "What is two plus two?",
    "Write a haiku about rain and the sea at night.",
    "def add(a, b):",
    "The quick brown fox jumps over the lazy dog, again and again.",
    "Name three colours.",
]


def test_a_slurm_array_eval_equals_the_one_host_eval(make_login, cluster, server, tmp_path):
    inventory_path, shared = make_login(shards=3)
    prompts = tmp_path / "varied.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in PROMPTS))
    cli = dflash(
        "remote-eval",
        "--hosts",
        "login",
        "--checkpoint",
        "step-12",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "16",
        "--budgets",
        "4,8",
        "-i",
        str(inventory_path),
        timeout=900,
    )
    assert cli.returncode == 0, cli.stderr
    # One progress view fed by the tasks' own events: a row per task and a total, complete.
    rows = {ln.split()[0]: ln for ln in cli.stderr.splitlines() if ln.strip()}
    assert {"login#0", "login#1", "login#2", "total"} <= set(rows), cli.stderr
    assert f"{len(PROMPTS)}/{len(PROMPTS)}" in rows["total"], cli.stderr
    merged = Path(cli.stdout.split("results:")[-1].strip())
    assert cluster.queue() == []
    assert len(server.requests) == len(PROMPTS)  # ground truth made once, by one task
    result = _result(merged)
    slurm = result["shards"]["slurm"]
    assert len(slurm["jobs"]) == 1 and slurm["done"] == [0, 1, 2]  # ONE array, 3 tasks
    jobs = result["shards"]["jobs"]
    assert [j["state"] for j in jobs] == ["done"] * 3
    assert sorted(i for p in result["shards"]["plan"] for i in p["samples"]) == sorted(
        r["id"] for r in _samples(merged)
    )
    for job in jobs:  # each task evaluated its slice of the one file, from the shared bundle
        folder = shared / "work" / "jobs" / job["job_id"]
        spec = json.loads((folder / "spec.json").read_text())
        assert spec["ground_truth"]["kind"] == "file"
        assert (merged / job["run_dir"] / "result.json").is_file()
    assert len(list((shared / "bundles").iterdir())) == 1

    inv = load_inventory(inventory_path)
    options = remote_eval.EvalOptions(
        prompts=str(prompts), max_new_tokens=16, engine=EvalSpec(budgets=(4, 8))
    )
    single = remote_eval.run_eval(inv, "login", "step-12", options)
    a, b = _samples(merged), _samples(single)
    assert [r["id"] for r in a] == [r["id"] for r in b] and len(a) == len(PROMPTS)
    assert _without_timings(a) == _without_timings(b)
    assert result["metrics"] == _result(single)["metrics"]


def test_a_slurm_array_eval_at_temperature_merges_every_tasks_expectation(make_login, cluster):
    """Above temperature 0 (the role's sampling), each array task computes the expectation
    of its slice; the merged ``expected`` is every sample's, equal to one host's run."""
    sampling = {"temperature": 0.7, "draft_policy": "sample", "top_k": 40}
    inventory_path, shared = make_login(sampling, shards=2)
    shared.mkdir(parents=True)
    gt = shared / "sampled-gt.jsonl"
    sampled_ground_truth(gt)
    inv = load_inventory(inventory_path)
    options = remote_eval.EvalOptions(
        ground_truth=str(gt), ground_truth_kind="file", engine=EvalSpec(budgets=())
    )
    merged = shard.run_sharded(inv, ["login"], "step-12", options)
    assert cluster.queue() == []
    result = _result(merged)
    assert result["shards"]["slurm"]["done"] == [0, 1]  # ONE array, 2 tasks
    exp = result["expected"]
    assert (exp["temperature"], exp["top_k"], exp["draft_policy"]) == (0.7, 40, "sample")
    records = _samples(merged)
    assert exp["samples"] == len(records) == 6  # both tasks' samples
    assert exp["tau"] == pytest.approx(sum(r["expected"]["tau"] for r in records) / 6)
    single = _result(remote_eval.run_eval(inv, "login", "step-12", options))
    assert single["expected"]["tau"] == pytest.approx(exp["tau"])
    assert single["expected"]["per_position"] == pytest.approx(exp["per_position"])


def _run(inventory_path: Path, gt: Path, run_id: str):
    inv = load_inventory(inventory_path)
    options = remote_eval.EvalOptions(
        ground_truth=str(gt), ground_truth_kind="file", engine=EvalSpec(budgets=(4,))
    )
    return (
        inv,
        options,
        lambda: shard.run_sharded(inv, ["login"], "step-12", options, run_id=run_id),
    )


def _assert_whole(merged: Path, gt: Path) -> None:
    ids = [json.loads(x)["id"] for x in gt.read_text().splitlines()]
    assert [r["id"] for r in _samples(merged)] == ids
    assert _result(merged)["metrics"]["samples"] == len(ids)


@pytest.mark.parametrize("how", ["scancel", "kill", "down"])
def test_a_task_cancelled_killed_or_lost_mid_run_is_told_retried_and_counted_once(
    make_login, cluster, how
):
    """Through the CLI, off a terminal: ONE line when task 1's attempt fails (which, why),
    ONE when its retry starts; the rows' final counts exact (the failed attempt's samples
    are not counted again); the failure in the attempt's job folder as the scheduler saw
    it. With --json (the kill) the lines are on stderr and stdout is the JSON alone."""
    inventory_path, shared = make_login(shards=2, max_retries=1)
    shared.mkdir(parents=True)
    gt = shared / "long-gt.jsonl"
    long_ground_truth(gt)
    records = [json.loads(x) for x in gt.read_text().splitlines()]
    plan = shard_plan.plan_shards(records, ["a", "b"])
    assert [s.indices for s in plan] == [[1, 2], [0, 3]]

    downed: list[str] = []

    def act(job: str, pid: int) -> None:
        if how == "scancel":
            cluster.command("scancel", f"{job}_1")
        elif how == "kill":
            os.kill(pid, signal.SIGKILL)  # the job's runner dies mid-sample, no exit.json
        else:  # its node is lost (an admin's DOWN on this one-machine cluster)
            [node] = cluster.command("squeue", "-h", "-j", f"{job}_1", "-o", "%N").split()
            cluster.set_node(node, "DOWN", "test")
            downed.append(node)

    as_json = ["--json"] if how == "kill" else []
    argv = ["remote-eval", "--hosts", "login", "--checkpoint", "step-12", "--ground-truth"]
    argv += [str(gt), "--ground-truth-kind", "file", "--budgets", "4", "-i", str(inventory_path)]
    watcher = MidRun(shared, act)
    try:
        cli = dflash(*argv, *as_json, timeout=900)
    finally:
        watcher.stop()
    assert cli.returncode == 0, cli.stderr
    assert len(watcher.done) == 1
    assert cluster.queue() == []
    if as_json:
        merged = Path(json.loads(cli.stdout)["run_dir"])  # stdout: the JSON, nothing else
    else:
        merged = Path(cli.stdout.split("results:")[-1].strip())
    result = _result(merged)
    attempts = result["shards"]["slurm"]["tasks"][1]["attempts"]
    first = {"scancel": "CANCELLED", "kill": "FAILED", "down": "NODE_FAIL"}[how]
    assert [a["state"] for a in attempts] == [first, "COMPLETED"]
    why = {
        "scancel": "cancelled on the cluster (scancel)",
        "kill": "killed by signal 9 (SIGKILL)",
        "down": f"node failure on {downed[0] if downed else '?'}",
    }[how]
    assert attempts[0]["why"] == why
    if how == "down":
        assert attempts[0]["nodes"] == downed[0] != attempts[1]["nodes"]
    tasks = result["shards"]["slurm"]["tasks"]
    # the other task ran once, or twice when it shared the lost node
    lost = [how == "down" and t["attempts"][0]["nodes"] == downed[0] for t in tasks]
    assert [len(t["attempts"]) for t in tasks] == [2 if lost[0] else 1, 2]
    assert result["shards"]["jobs"][1]["job_id"] != watcher.done[0]  # a fresh attempt's folder
    _assert_whole(merged, gt)

    # Told as it happened: one line for the failure, one for the retry's start.
    told = [ln for ln in cli.stderr.splitlines() if ln.startswith("login#1: ")]
    failed, retry = attempts[0]["job"], attempts[1]["job"]
    assert told[0] == f"login#1: attempt 1 of 2 ({failed}) failed: {why}; retrying as {retry}"
    assert told[1].startswith(f"login#1: retry {retry} (attempt 2 of 2) started on n")
    assert len(told) == 2, cli.stderr
    if not as_json:  # off a terminal, the view's last frame: every sample counted once
        rows = {ln.split()[0]: ln for ln in cli.stderr.splitlines() if ln.strip()}
        assert re.search(r" 2/2 ", rows["login#1"]), cli.stderr
        assert re.search(r" 2/2 ", rows["login#0"]), cli.stderr
        assert re.search(r" 4/4 ", rows["total"]), cli.stderr
    # The attempt's job folder says how it ended, as the scheduler saw it.
    folder = shared / "work" / "jobs" / watcher.done[0]
    ended = json.loads((folder / "exit.json").read_text())
    if how == "scancel":
        assert ended["state"] == "cancelled" and ended["error"] == "cancelled by request"
    else:
        assert ended["state"] == "failed" and ended["error"].startswith(why), ended
        assert json.loads((folder / "slurm.json").read_text())["state"] == first


def test_a_task_cancelled_past_its_retries_is_one_line_and_nothing_is_queued(make_login, cluster):
    inventory_path, shared = make_login(shards=2, max_retries=0)
    shared.mkdir(parents=True)
    gt = shared / "long-gt.jsonl"
    long_ground_truth(gt)
    run_id = "mid-exhausted"
    inv, _, go = _run(inventory_path, gt, run_id)
    cancel = lambda job, _pid: cluster.command("scancel", f"{job}_1")  # noqa: E731
    watcher = MidRun(shared, cancel, run_id=run_id)
    try:
        with pytest.raises(JobError) as err:
            go()
    finally:
        watcher.stop()
    message = str(err.value)
    assert "\n" not in message and watcher.done
    assert message.startswith(f"login: 1 of 2 tasks of array {run_id} failed: task 1 ")
    assert "CANCELLED" in message and "after 1 attempt" in message
    assert cluster.queue() == []
    assert not (results_dir(inv) / run_id).exists()  # nothing half-written


def test_sigterm_of_the_cli_cancels_the_array_and_leaves_nothing_queued(make_login, cluster):
    """A polite stop (SIGTERM, as Ctrl-C) of ``dflash remote-eval`` while a task runs:
    every active attempt is scancel'ed and watched out of the queue before it exits."""
    inventory_path, shared = make_login(shards=2)
    shared.mkdir(parents=True)
    gt = shared / "long-gt.jsonl"
    long_ground_truth(gt)
    argv = ["remote-eval", "--hosts", "login", "--checkpoint", "step-12", "--ground-truth"]
    argv += [str(gt), "--ground-truth-kind", "file", "--budgets", "4", "-i", str(inventory_path)]
    done = signal_mid_shard(cluster, shared, argv, signal.SIGTERM, tasks="*-0-*")
    stderr = done.stderr
    assert done.returncode == 143, stderr
    assert "terminated" in stderr and "Traceback" not in stderr
    assert cluster.queue() == []  # cancelled before the command ended


# ---- without a cluster --------------------------------------------------------------------


def test_a_slurm_role_checks_its_shards_and_a_login_node_is_named_alone(make_inventory):
    with pytest.raises(SlurmError, match=r"^slurm\.shards: 0 is not a whole number of at least 1"):
        SlurmRole.from_mapping({"shared": "/scratch/x", "shards": 0})
    assert SlurmRole.from_mapping({"shared": "/scratch/x"}).shards == 4
    path = make_inventory(
        hosts={
            "login": {"transport": "local", "roles": {"slurm": {"shared": "/scratch/x"}}},
            "b": {"transport": "local"},
        }
    )
    with pytest.raises(DflashError) as err:
        shard.run_sharded(load_inventory(path), ["login", "b"], "step-12")
    assert str(err.value) == (
        "--hosts: login is a Slurm login node: name it alone (its array tasks are the shards)"
    )


def test_a_prompts_file_with_duplicate_ids_is_refused_before_anything_is_submitted(
    make_login, cluster, tmp_path
):
    inventory_path, shared = make_login(shards=2)
    prompts = tmp_path / "twice.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": "p1", "prompt": t}) + "\n" for t in ("Hi.", "Hello."))
    )
    argv = ["remote-eval", "--hosts", "login", "--checkpoint", "step-12", "--prompts"]
    cli = dflash(*argv, str(prompts), "-i", str(inventory_path), timeout=300)
    assert cli.returncode != 0
    assert one_error_line(cli) == (
        f"error: {prompts}:2: id 'p1' is line 1's too; give each prompt its own id"
    )
    assert cluster.queue() == []
    # nothing submitted: no array's job folder (and no prompts pushed) on the shared folder
    assert not shared.exists() or not [p.name for p in shared.iterdir() if p.name != "bundles"]
