"""A Slurm that misbehaves, on the loopback cluster: every wait bounded, every fault said.

The login node here is a loopback sshd whose ``squeue``, ``scancel`` and ``sacct`` are the
cluster's own, wrapped (`tests/helpers/slurm.FaultyCommands`) to misbehave on demand: a
squeue that goes on listing finished tasks as RUNNING, or forgets a running one; a scancel
that never answers; a sacct whose answer is garbled (accounting is optional). The library
and the CLI must bound each wait, say what they did in one line, leave nothing running,
and never fail an eval whose tasks all finished. Then the words and records without a
cluster: why an attempt failed, and what ``job array-end`` writes in its job folder.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from orchestrator.slurm import array
from orchestrator.slurm.array import ArrayRun, run_array
from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.role import SlurmError
from orchestrator.slurm.status import Attempt
from orchestrator.transport.hosts import open_host
from remote.errors import UserError
from remote.jobs.slurm_end import record_end
from tests.helpers.cli import dflash
from tests.helpers.slurm import (
    FaultyCommands,
    Work,
    login_spec,
    long_ground_truth,
    signal_mid_shard,
)
from tests.helpers.sshd import ssh_host_entry, start_sshd


@pytest.fixture(scope="module")
def faulty_login(slurm_cluster, ssh_base, user_key, tmp_path_factory):
    """A login node of the session's cluster whose Slurm commands are `FaultyCommands`."""
    faults = FaultyCommands(tmp_path_factory.mktemp("faulty-slurm-bin"))
    server = start_sshd(ssh_base, "faulty-login", faults.sshd_config(slurm_cluster))
    server.faults = faults
    yield server
    server.stop()


@pytest.fixture
def faults(cluster, faulty_login):
    """The faulty login node's switches, all off before and after the test."""
    faulty_login.faults.off()
    yield faulty_login.faults
    faulty_login.faults.off()


@pytest.fixture
def client(faults, faulty_login, ssh_base):
    with open_host(login_spec(faulty_login, ssh_base, "faulty")) as host:
        yield SlurmClient(host)


@pytest.fixture
def make_login(cluster, faulty_login, ssh_base, make_inventory, eval_role, tmp_path):
    """An inventory whose host ``login`` is the faulty login node; (its path, the shared
    folder of the run, the run's long ground truth there)."""

    def write(**slurm):
        shared = cluster.shared / tmp_path.name
        role = {"shared": str(shared), "mem_per_task": "256M", "poll_seconds": 0.3, **slurm}
        entry = ssh_host_entry(faulty_login, ssh_base, roles={"slurm": role, "eval": eval_role()})
        path = make_inventory(
            hosts={"login": entry},
            defaults={"eval_host": "login", "results_dir": str(tmp_path / "results")},
        )
        shared.mkdir(parents=True)
        long_ground_truth(shared / "long-gt.jsonl")
        return path, shared, shared / "long-gt.jsonl"

    return write


def _eval_argv(inventory: Path, gt: Path) -> list[str]:
    argv = ["remote-eval", "--hosts", "login", "--checkpoint", "step-12", "--ground-truth"]
    return argv + [str(gt), "--ground-truth-kind", "file", "--budgets", "4", "-i", str(inventory)]


# ---- the library, against the faulty login node ------------------------------------


def test_squeue_listing_ended_tasks_as_running_is_trusted_after_a_grace(
    cluster, faults, client, monkeypatch
):
    """Every task wrote its exit record; squeue keeps saying RUNNING: after the grace the
    records are trusted, said in a note, and what squeue still shows is scancelled."""
    monkeypatch.setattr(array, "EXIT_GRACE", 1.0, raising=False)
    faults.on("running")
    work = Work(cluster, "stale")

    status = run_array(client, work.plan("stale", tasks=2), timeout=30)

    assert status.done == (0, 1)
    refs = sorted(t.last.ref for t in status.tasks)
    for t in status.tasks:
        assert t.last.exit_code == 0 and "squeue still listed it RUNNING 1s" in t.last.reason
    assert status.notes and all(
        n.startswith("faulty: squeue still listed ") and "trusted the record" in n
        for n in status.notes
    )
    assert sorted(r for line in faults.cancelled() for r in line.split()) == refs
    assert cluster.queue() == []


def test_a_task_squeue_forgets_is_lost_cancelled_and_retried(cluster, faults, client):
    work = Work(cluster, "forgotten")
    work.hold(1)
    run = ArrayRun(client, work.plan("forgotten", tasks=2, max_retries=1))
    (job,) = run.start().job_ids

    def forget(status) -> None:  # once task 1 runs, squeue no longer lists it
        if work.pid(1) and not (faults.dir / "hide").exists():
            faults.on("hide", f"^{job}\\|1\\|\n")

    status = run.wait(timeout=90, on_update=forget)

    first, second = status.tasks[1].attempts
    assert first.state == "LOST" and second.state == "COMPLETED"
    assert work.out(1).startswith(f"task 1 job {second.job_id} ")
    # the forgotten attempt was ended, not left running beside its retry
    real = cluster.command("squeue", "-h", "-t", "all", "-j", f"{job}_1", "-o", "%T")
    assert real.split() == ["CANCELLED"]
    assert f"{job}_1" in faults.cancelled()
    assert first.reason.endswith("; cancelled in case it still runs")
    assert cluster.queue() == []


def test_a_hung_scancel_on_the_way_out_is_bounded_and_names_the_job(
    cluster, faults, client, monkeypatch
):
    monkeypatch.setattr(array, "STOP_COMMAND_TIMEOUT", 2.0, raising=False)
    work = Work(cluster, "hung")
    work.hold(0)
    faults.on("hang")

    with pytest.raises(SlurmError) as err:
        run_array(client, work.plan("hung", tasks=1), timeout=3)

    message = str(err.value)
    assert "\n" not in message
    m = re.fullmatch(
        r"faulty: array hung did not finish within 3s \(task 0 (\d+)_0 RUNNING on n\d\); its "
        r"tasks are cancelled; and stopping the array failed: faulty: array hung may still "
        r"be queued or running \(scancel did not answer: faulty: command timed out after "
        r"2(\.0)?s\); cancel it by hand on faulty: scancel (\d+)",
        message,
    )
    assert m and m.group(1) == m.group(3), message
    assert cluster.queue() == [f"{m.group(1)}_0 RUNNING"]  # what the line asks to cancel
    faults.off()
    work.release(0)


def test_a_garbled_sacct_is_a_note_and_the_exit_records_stand_in(cluster, faults, client):
    faults.on("garble")
    work = Work(cluster, "garbled")

    status = run_array(client, work.plan("garbled", tasks=2), timeout=60)

    assert status.done == (0, 1)
    off = status.accounting["sacct"]
    assert status.accounting["source"] == "squeue and the job folder's exit records"
    assert off.startswith("sacct's answer was unreadable: faulty: sacct line 1 has 3 fields")
    assert status.notes == (
        f"{off}; the tasks' ends are read from squeue and the job folder's exit records",
    )
    assert cluster.queue() == []


# ---- the eval and the CLI, against the faulty login node ------------------------------


def test_an_eval_whose_sacct_is_garbled_is_merged_with_one_note(make_login, cluster, faults):
    inventory, _, gt = make_login(shards=2)
    faults.on("garble")

    cli = dflash(*_eval_argv(inventory, gt), "--json", timeout=900)

    assert cli.returncode == 0, cli.stderr
    merged = Path(json.loads(cli.stdout)["run_dir"])  # stdout: the JSON alone
    result = json.loads((merged / "result.json").read_text())
    assert result["metrics"]["samples"] == 4
    assert "unreadable" in result["shards"]["slurm"]["accounting"]["sacct"]
    notes = [ln for ln in cli.stderr.splitlines() if "sacct's answer was unreadable" in ln]
    assert len(notes) == 1 and notes[0].startswith("warning (login): sacct's answer"), cli.stderr
    assert cluster.queue() == []


def test_sigterm_while_scancel_hangs_exits_143_naming_the_array_job(make_login, cluster, faults):
    inventory, shared, gt = make_login(shards=2)
    faults.on("hang")  # no scancel is asked for until the SIGTERM

    done = signal_mid_shard(cluster, shared, _eval_argv(inventory, gt), signal.SIGTERM)

    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr
    last = [ln for ln in done.stderr.splitlines() if ln.strip()][-1]
    m = re.fullmatch(
        r"terminated: login: array (\S+) may still be queued or running \(scancel did not "
        r"answer: login: command timed out after 15(\.0)?s\); cancel it by hand on login: "
        r"scancel (\d+)",
        last,
    )
    assert m, done.stderr
    array = m.group(3)
    asked = {t.split("_")[0] for call in faults.cancelled() for t in call.split()}
    assert asked == {array}, faults.cancelled()
    # Its tasks may end while scancel hangs; whatever is still queued is that array.
    assert {ln.split("_")[0] for ln in cluster.queue()} <= {array}
    faults.off()  # the hung scancel goes on and cancels it


# ---- without a cluster -------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "why"),
    [
        (Attempt(7, 1, "CANCELLED"), "cancelled on the cluster (scancel)"),
        (Attempt(7, 1, "FAILED", exit_code=137), "killed by signal 9 (SIGKILL)"),
        (Attempt(7, 1, "FAILED", accounting={"signal": 15}), "killed by signal 15 (SIGTERM)"),
        (Attempt(7, 1, "FAILED", exit_code=3), "exit code 3"),
        (Attempt(7, 1, "NODE_FAIL", nodes="n2"), "node failure on n2"),
        (Attempt(7, 1, "TIMEOUT"), "time limit reached"),
        (Attempt(7, 1, "OUT_OF_MEMORY"), "out of memory"),
        (Attempt(7, 1, "LOST", reason="squeue no longer lists it"), "lost: squeue no longer"),
        (Attempt(7, 1, "RUNNING"), ""),
    ],
)
def test_why_an_attempt_failed_is_a_few_words(attempt, why):
    assert attempt.why.startswith(why) and (why or attempt.why == "")
    assert ("why" in attempt.to_json()) == bool(why)


def _job_folder(workdir: Path, job_id: str, exit_info: dict | None) -> Path:
    folder = workdir / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text("{}")
    if exit_info is not None:
        (folder / "exit.json").write_text(json.dumps(exit_info))
    return folder


def test_the_schedulers_end_is_written_in_the_attempts_job_folder(tmp_path):
    cancelled = {"state": "cancelled", "code": 143, "error": "cancelled by request"}
    end = {"job": "58_1", "state": "NODE_FAIL", "nodes": "n2", "why": "node failure on n2"}
    # a node failure reached the job as a SIGTERM: its "cancelled by request" is replaced
    folder = _job_folder(tmp_path, "r-1-58", cancelled)
    state = record_end(str(tmp_path), "r-1-58", end)
    assert state["state"] == "failed"
    assert state["exit"]["error"] == "node failure on n2 (Slurm: 58_1 NODE_FAIL)"
    assert state["exit"]["runner"] == cancelled and state["exit"]["code"] == 143
    assert json.loads((folder / "slurm.json").read_text())["state"] == "NODE_FAIL"
    # a scancel: the job's own record is right and stays
    _job_folder(tmp_path, "r-1-59", cancelled)
    state = record_end(str(tmp_path), "r-1-59", {**end, "state": "CANCELLED", "why": "cancel"})
    assert state["exit"] == cancelled
    # a SIGKILL left no record: the scheduler's is the only one
    _job_folder(tmp_path, "r-1-60", None)
    killed = {**end, "state": "FAILED", "why": "killed by signal 9 (SIGKILL)", "exit_code": 137}
    state = record_end(str(tmp_path), "r-1-60", killed)
    assert state["state"] == "failed" and state["exit"]["code"] == 137
    with pytest.raises(UserError, match=r"^job array-end: the attempt's end: nodes 'n2;rm' "):
        record_end(str(tmp_path), "r-1-60", {**end, "nodes": "n2;rm"})
