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
import random
import signal
import threading
import time
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
from tests.helpers.cli import dflash
from tests.helpers.slurm import signal_mid_shard
from tests.helpers.sshd import ssh_host_entry


@pytest.fixture
def make_login(cluster, slurm_login, ssh_base, make_inventory, eval_role, tmp_path):
    """An inventory whose host ``login`` is the cluster's login node (its slurm role with
    `slurm` on top) and, with the same eval role, an ordinary eval host."""

    def write(**slurm):
        shared = cluster.shared / tmp_path.name
        role = {"shared": str(shared), "mem_per_task": "256M", "poll_seconds": 0.3, **slurm}
        entry = ssh_host_entry(slurm_login, ssh_base, roles={"slurm": role, "eval": eval_role()})
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


def _long_ground_truth(path: Path) -> None:
    """Planned over 2 tasks by tokens: g1, g2 -> task 0; g0 (short), g3 -> task 1, whose
    long second sample is seconds of work after its first one's event."""
    rng = random.Random(5)
    with open(path, "w") as fh:
        for i, n in enumerate([40, 2980, 3000, 3000]):
            fh.write(
                json.dumps(
                    {
                        "id": f"g{i}",
                        "prompt_ids": [rng.randrange(8, 300) for _ in range(12)],
                        "completion_ids": [rng.randrange(8, 300) for _ in range(n)],
                    }
                )
                + "\n"
            )


class MidRun:
    """Waits (in a thread) until task 1's first attempt has evaluated a sample, then does
    `act(array job id, the job's runner pid)` to it once."""

    def __init__(self, shared: Path, run_id: str, act):
        self.jobs = shared / "work" / "jobs"
        self.run_id, self.act = run_id, act
        self.done: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 600
        while not self._stop.is_set() and time.monotonic() < deadline:
            for folder in sorted(self.jobs.glob(f"{self.run_id}-1-*")):
                events = folder / "events.jsonl"
                pid = folder / "pid.json"
                if events.exists() and pid.exists() and '"sample"' in events.read_text():
                    self.act(folder.name.rsplit("-", 1)[1], json.loads(pid.read_text())["pid"])
                    self.done.append(folder.name)
                    return
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


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
def test_a_task_cancelled_killed_or_lost_mid_run_is_resubmitted_and_merged(
    make_login, cluster, how
):
    inventory_path, shared = make_login(shards=2, max_retries=1)
    shared.mkdir(parents=True)
    gt = shared / "long-gt.jsonl"
    _long_ground_truth(gt)
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

    run_id = f"mid-{how}"
    _, _, go = _run(inventory_path, gt, run_id)
    watcher = MidRun(shared, run_id, act)
    try:
        merged = go()
    finally:
        watcher.stop()
    assert len(watcher.done) == 1
    assert cluster.queue() == []
    result = _result(merged)
    attempts = result["shards"]["slurm"]["tasks"][1]["attempts"]
    first = {"scancel": "CANCELLED", "kill": "FAILED", "down": "NODE_FAIL"}[how]
    assert [a["state"] for a in attempts] == [first, "COMPLETED"]
    if how == "down":
        assert attempts[0]["nodes"] == downed[0] != attempts[1]["nodes"]
    tasks = result["shards"]["slurm"]["tasks"]
    # the other task ran once, or twice when it shared the lost node
    lost = [how == "down" and t["attempts"][0]["nodes"] == downed[0] for t in tasks]
    assert [len(t["attempts"]) for t in tasks] == [2 if lost[0] else 1, 2]
    assert result["shards"]["jobs"][1]["job_id"] != watcher.done[0]  # a fresh attempt's folder
    _assert_whole(merged, gt)


def test_a_task_cancelled_past_its_retries_is_one_line_and_nothing_is_queued(make_login, cluster):
    inventory_path, shared = make_login(shards=2, max_retries=0)
    shared.mkdir(parents=True)
    gt = shared / "long-gt.jsonl"
    _long_ground_truth(gt)
    run_id = "mid-exhausted"
    inv, _, go = _run(inventory_path, gt, run_id)
    watcher = MidRun(shared, run_id, lambda job, _pid: cluster.command("scancel", f"{job}_1"))
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
    _long_ground_truth(gt)
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
