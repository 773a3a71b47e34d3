"""``dflash follow`` with a Slurm login node as its eval host, on the loopback cluster.

The trainer is a loopback sshd with two checkpoints trained for real; the login node is
the session's cluster login (`tests/conftest.py`). Each checkpoint is relayed to the
login node's drafters folder (on the shared folder) and evaluated as ONE job array, the
way ``remote-eval --hosts <login>`` does; the results must equal those of follow on a
plain SSH eval host, with nothing left queued. A stop (SIGTERM, as Ctrl-C) cancels the
arrays on the way out; a crash (SIGKILL) leaves them, and the next follower scancels them
before it evaluates afresh.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from orchestrator.eval.follow import loop as follow
from orchestrator.eval.follow.checkpoint import _saved_job_state
from orchestrator.eval.spec import EvalOptions
from orchestrator.inventory import load_inventory
from remote.protocol import EvalSpec
from tests.helpers.slurm import signal_mid_shard
from tests.helpers.sshd import ssh_host_entry

pytestmark = pytest.mark.slow
STEPS = ("step-6", "step-12")


@pytest.fixture
def make_setup(
    cluster,
    slurm_login,
    trainer_sshd,
    eval_sshd,
    ssh_base,
    make_inventory,
    eval_role,
    trained_drafters,
    tmp_path,
):
    """``make_setup(**eval_settings)``: an inventory of ``trainer`` (both checkpoints,
    complete), ``login`` (the cluster's login node, its drafters on the shared folder) and
    ``plain`` (an SSH eval host), the eval hosts with the same eval settings. Returns
    (inventory path, shared folder)."""
    tag = tmp_path.name[-24:]
    ckpts = trainer_sshd.root / f"slurm-ckpts-{tag}"
    for name in STEPS:
        shutil.copytree(trained_drafters / name, ckpts / name)
        (ckpts / name / "COMPLETE").write_text("")
    shared = cluster.shared / f"follow-{tag}"
    trainer = ssh_host_entry(
        trainer_sshd,
        ssh_base,
        roles={"trainer": {"checkpoints": str(ckpts), "complete_rule": "marker"}},
    )

    def write(**settings) -> tuple[Path, Path]:
        login = ssh_host_entry(
            slurm_login,
            ssh_base,
            roles={
                "slurm": {"shared": str(shared), "mem_per_task": "256M", "poll_seconds": 0.3},
                "eval": eval_role(drafters=str(shared / "drafters"), **settings),
            },
        )
        plain = ssh_host_entry(
            eval_sshd,
            ssh_base,
            workdir=str(eval_sshd.root / f"slurm-wd-{tag}"),
            roles={"eval": eval_role(drafters=str(eval_sshd.root / f"slurm-d-{tag}"), **settings)},
        )
        path = make_inventory(
            hosts={"trainer": trainer, "login": login, "plain": plain},
            defaults={"results_dir": str(tmp_path / "results")},
        )
        return path, shared

    return write


def _samples(run_dir: str) -> list[dict]:
    lines = (Path(run_dir) / "samples.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]


def _result(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())


def test_follow_through_slurm_equals_follow_on_an_ssh_host(make_setup, cluster, server):
    inventory_path, shared = make_setup(samples=3, max_new_tokens=12)
    inv = load_inventory(inventory_path)
    options = follow.FollowOptions(eval=EvalOptions(engine=EvalSpec(budgets=(4,))))
    seen: list[tuple[str, str, str]] = []

    class Events(follow.FollowEvents):
        def shard_event(self, checkpoint: str, host: str, event: dict) -> None:
            seen.append((checkpoint, host, event.get("event")))

    through_slurm = follow.follow_pass(inv, "trainer", "login", options, Events())
    assert cluster.queue() == []
    # The first checkpoint's ground-truth task made it; the second's read the shared cache.
    assert len(server.requests) == 3
    plain = follow.follow_pass(inv, "trainer", "plain", options)
    assert [e["checkpoint"] for e in through_slurm] == list(STEPS)
    assert [e["checkpoint"] for e in plain] == list(STEPS)
    for s, p in zip(through_slurm, plain, strict=True):
        assert s["state"] == p["state"] == "done"
        assert s["run_id"] == s["job_id"] and s["host"] == "login"
        assert _samples(s["run_dir"]) == _samples(p["run_dir"])
        assert _result(s["run_dir"])["metrics"] == _result(p["run_dir"])["metrics"]
        keys = ("tau_per_sample_mean", "tau_token_weighted", "ddtree")
        assert [s[k] for k in keys] == [p[k] for k in keys]
        slurm = _result(s["run_dir"])["shards"]["slurm"]
        assert slurm["name"] == s["job_id"] and len(slurm["jobs"]) == 1  # ONE array each
        assert (shared / f"{s['job_id']}-gt").is_dir()  # its ground truth's array, named by it
    # Each checkpoint's tasks reported through the follower's events, per task.
    assert {c for c, _, _ in seen} == set(STEPS)
    assert {h for _, h, e in seen if e == "slurm_task"} >= {"login#gt", "login#0"}
    # A second pass has nothing new to evaluate.
    assert follow.follow_pass(inv, "trainer", "login", options) == []
    assert cluster.queue() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_stopped_follow_cancels_its_arrays_and_a_crashed_ones_are_cancelled_next(
    make_setup, cluster, sig
):
    """SIGTERM (as Ctrl-C): the arrays are scancel'ed before follow exits (143). SIGKILL:
    they are left, and the next follower's look at the saved evaluation scancels them."""
    gt = cluster.shared / f"follow-{sig.name}-gt.jsonl"
    # A ground truth of long completions keeps each task busy for a while.
    gt.write_text(
        "".join(
            json.dumps({"id": f"g{i}", "prompt_ids": [9 + i] * 12, "completion_ids": [7] * 2500})
            + "\n"
            for i in range(4)
        )
    )
    inventory_path, shared = make_setup(ground_truth=str(gt), ground_truth_kind="file")
    argv = ["follow", "--from", "trainer", "--to", "login", "--once", "--budgets", "4"]
    done = signal_mid_shard(cluster, shared, [*argv, "-i", str(inventory_path)], sig)
    stderr = done.stderr
    inv = load_inventory(inventory_path)
    folder = follow.state_dir(inv, "trainer", "login")
    inflight = json.loads((folder / "state.json").read_text())["inflight"]
    if sig == signal.SIGTERM:
        assert done.returncode == 143, stderr
        assert "Traceback" not in stderr and "terminated" in stderr
        assert cluster.queue() == []  # cancelled before the command ended
        assert inflight == {} and follow.read_history(folder) == []
        return
    assert done.returncode == -signal.SIGKILL
    assert cluster.queue()  # a crash cancels nothing
    [(name, saved)] = inflight.items()
    assert name == STEPS[0]
    # The next follower finds the evaluation in flight: its arrays are cancelled by name,
    # and the checkpoint is to be evaluated afresh (no job of that id to attach to).
    assert _saved_job_state(inv, "login", saved["job_id"]) is None
    cluster.wait_until(lambda: cluster.queue() == [], 120, "the crashed follower's arrays")
