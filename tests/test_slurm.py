"""The Slurm backend's foundation (`orchestrator.slurm`) against a real Slurm on loopback.

A cluster of two slurmd nodes (`tests/helpers/slurm.py`) and a loopback sshd acting as its
login node: the library runs sbatch, squeue and scancel there over SSH, as it would on a
real cluster. Each test's array runs a small shell task from the shared folder that writes
``out/<task>``; a ``hold/<task>`` file makes that task's first attempt record its pid and
wait, so a test can cancel it, kill it or put its node down while it runs. Every wait is
bounded, and every test ends with nothing queued or running (asserted with squeue).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from orchestrator.slurm import answers
from orchestrator.slurm.array import ArrayRun, ArrayStatus, run_array
from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.plan import ArrayPlan, array_spec
from orchestrator.slurm.role import SlurmError, SlurmRole
from orchestrator.transport.hosts import open_host
from tests.helpers.slurm import Work, login_spec
from tests.helpers.sshd import start_sshd


@pytest.fixture
def client(cluster, slurm_login, ssh_base):
    """The Slurm commands on the login node; `cluster` leaves the cluster as found."""
    with open_host(login_spec(slurm_login, ssh_base, "login")) as host:
        yield SlurmClient(host)


def _states(status: ArrayStatus, task: int) -> list[str]:
    return [a.state for a in status.tasks[task].attempts]


# ---- against the loopback cluster ------------------------------------------------------


def test_array_runs_each_task_once_as_one_job(cluster, client):
    work = Work(cluster, "all")
    status = run_array(client, work.plan("all"), timeout=90)

    assert status.finished and status.done == (0, 1, 2) and status.failed == ()
    assert len(status.job_ids) == 1  # ONE array job for all tasks
    job = status.job_ids[0]
    for t in range(3):
        assert _states(status, t) == ["COMPLETED"]
        node = status.tasks[t].last.nodes
        assert node in cluster.nodes
        assert work.out(t) == f"task {t} job {job} node {node}"
    assert status.to_json()["tasks"][0]["attempts"][0]["job"] == f"{job}_0"
    assert cluster.queue() == []


def test_cancelled_task_is_a_failed_task_and_is_not_resubmitted(cluster, client):
    work = Work(cluster, "cancel")
    work.hold(1)
    run = ArrayRun(client, work.plan("cancel", max_retries=1))
    run.start()
    cancelled = []

    def cancel_when_running(status: ArrayStatus) -> None:
        if not cancelled and work.pid(1) and status.tasks[1].verdict == "running":
            cancelled.append(run.cancel([1]))

    status = run.wait(timeout=90, on_update=cancel_when_running)

    assert cancelled == [""]  # scancel had nothing to complain about
    assert status.done == (0, 2) and status.failed == (1,)
    assert _states(status, 1) == ["CANCELLED"]  # someone chose it: not worth a retry
    line = status.failure_line()
    assert "\n" not in line and "task 1" in line and "CANCELLED" in line and "login" in line
    assert not (work.dir / "out" / "1").exists()
    assert cluster.queue() == []


def test_killed_task_is_resubmitted_once_and_ends_done(cluster, client):
    work = Work(cluster, "kill")
    work.hold(2)
    killed = []

    def kill_when_running(status: ArrayStatus) -> None:
        pid = work.pid(2)
        if not killed and pid:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    status = run_array(
        client, work.plan("kill", max_retries=1), timeout=90, on_update=kill_when_running
    )

    assert killed
    assert status.done == (0, 1, 2)
    first, second = status.tasks[2].attempts
    assert first.state == "FAILED" and second.state == "COMPLETED"
    assert second.job_id != first.job_id  # a new array of just the failed task
    assert work.out(2).startswith(f"task 2 job {second.job_id} ")
    assert [len(t.attempts) for t in status.tasks] == [1, 1, 2]
    assert cluster.queue() == []


def test_retries_are_bounded(cluster, client):
    work = Work(cluster, "bounded")
    plan = work.plan("bounded", tasks=1, max_retries=1)
    plan = ArrayPlan(plan.role, plan.name, 1, ("/bin/sh", "-c", "exit 3"))

    status = run_array(client, plan, timeout=90)

    assert status.failed == (0,)
    assert _states(status, 0) == ["FAILED", "FAILED"]  # the first try and ONE retry
    assert "after 2 attempts" in status.failure_line()
    assert cluster.queue() == []


def test_node_down_mid_task_is_a_failed_task_not_a_hang(cluster, client):
    work = Work(cluster, "down")
    work.hold(1)
    downed: list[str] = []

    def down_its_node(status: ArrayStatus) -> None:
        task = status.tasks[1]
        if not downed and work.pid(1) and task.verdict == "running" and task.last.nodes:
            cluster.set_node(task.last.nodes, "DOWN", "test")
            downed.append(task.last.nodes)

    status = run_array(
        client, work.plan("down", max_retries=1), timeout=120, on_update=down_its_node
    )

    assert downed and cluster.node_states()[downed[0]] == "down"
    first, second = status.tasks[1].attempts
    assert first.state == "NODE_FAIL" and first.nodes == downed[0]
    assert second.state == "COMPLETED" and second.nodes != downed[0]
    assert status.done == (0, 1, 2)
    assert cluster.queue() == []


def test_deadline_cancels_the_array_and_says_so_in_one_line(cluster, client):
    work = Work(cluster, "deadline")
    work.hold(0)

    with pytest.raises(SlurmError) as err:
        run_array(client, work.plan("deadline", tasks=2), timeout=4)

    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("login: array deadline did not finish within 4s")
    assert "task 0" in message and "cancelled" in message
    assert cluster.queue() == []  # stopped before the error came out


def test_tasks_the_scheduler_forgot_are_read_from_the_job_folder(cluster, client):
    work = Work(cluster, "forgot")
    with cluster.configured(MinJobAge="2"):
        run = ArrayRun(client, work.plan("forgot", max_retries=1))
        (job,) = run.start().job_ids
        cluster.wait_until(
            lambda: str(job) not in cluster.command("squeue", "-h", "-t", "all", "-o", "%F"),
            60,
            f"the scheduler still lists job {job}",
        )
        # Task 2's attempt left no exit record: neither the scheduler nor the folder knows it.
        Path(run.plan.folder, "tasks", f"2.{job}.exit").unlink()
        looked = run.poll(resubmit=False)
        status = run.wait(timeout=90)

    assert _states(looked, 0) == ["COMPLETED"] and "job folder" in looked.tasks[0].last.reason
    assert _states(looked, 2) == ["LOST"] and looked.tasks[2].verdict == "failed"
    assert status.done == (0, 1, 2)
    assert _states(status, 2) == ["LOST", "COMPLETED"]  # lost is worth a second attempt
    assert cluster.queue() == []
    # This cluster keeps no accounting: sacct's refusal is recorded, and the run went on
    # with squeue and the job folder; sacct was asked once, not at every look.
    fallback = {
        "source": "squeue and the job folder's exit records",
        "sacct": "sacct: Slurm accounting storage is disabled",
    }
    assert looked.accounting == fallback and status.to_json()["accounting"] == fallback
    assert all("accounting" not in a for t in status.to_json()["tasks"] for a in t["attempts"])


def test_job_folder_of_an_earlier_run_is_refused(cluster, client):
    work = Work(cluster, "twice")
    plan = work.plan("twice", tasks=1)
    run_array(client, plan, timeout=90)

    with pytest.raises(SlurmError, match=r"^login: job folder .* exists already; give the run"):
        run_array(client, plan, timeout=90)
    assert cluster.queue() == []


# ---- what a login node answers is checked --------------------------------------------

FAKE_SQUEUE = """#!/bin/sh
# squeue as a broken or hostile login node might answer: one odd field per job id
case "$*" in
  *"-j 41 "*) echo '41|0|RUNNING|n1;reboot|None' ;;
  *"-j 42 "*) echo '42|0|RUNNNING|n1|None' ;;
  *"-j 43 "*) echo '43|9|RUNNING|n1|None' ;;
  *"-j 44 "*) echo '44|0|RUNNING|n1' ;;
esac
"""


# sacct as a cluster with accounting answers (``--parsable2 --noheader``, ACCOUNT_FORMAT):
# each task's allocation line, then its steps; the queued rest of an array as a range.
SACCT_ANSWER = """\
57_0|COMPLETED|0:0|12|
57_0.batch|COMPLETED|0:0|12|10244K
57_0.extern|COMPLETED|0:0|12|1084K
57_1|CANCELLED by 0|0:15|7|
57_1.batch|CANCELLED|0:15|7|2.50M
57_1.extern|COMPLETED|0:0|7|0
57_2|OUT_OF_MEMORY|0:125|30|
57_2.batch|OUT_OF_MEMORY|0:125|30|1.5G
57_[3-5%2]|PENDING|0:0|0|
"""

# Job 57: the answer above. Job 58: no accounting storage (counts how often it is asked).
FAKE_SACCT = f"""#!/bin/sh
case "$*" in
  *"-j 57 "*) printf '%s' '{SACCT_ANSWER}' ;;
  *"-j 58 "*)
    echo x >> "$(dirname "$0")/asked"
    echo 'Slurm accounting storage is disabled' >&2
    exit 1 ;;
esac
"""


@pytest.fixture(scope="module")
def odd_login(ssh_base, user_key, tmp_path_factory):
    """A login node whose sbatch and squeue print what no Slurm does (and whose sacct
    answers as a cluster with accounting, or without)."""
    bin_dir = tmp_path_factory.mktemp("odd-slurm-bin")
    (bin_dir / "squeue").write_text(FAKE_SQUEUE)
    (bin_dir / "sbatch").write_text("#!/bin/sh\ncat >/dev/null\necho '57;x y'\n")
    (bin_dir / "sacct").write_text(FAKE_SACCT)
    for tool in ("squeue", "sbatch", "sacct"):
        (bin_dir / tool).chmod(0o755)
    server = start_sshd(ssh_base, "odd-login", (f"SetEnv PATH={bin_dir}:/usr/bin:/bin",))
    server.bin_dir = bin_dir
    yield server
    server.stop()


def test_sacct_gives_each_tasks_end_elapsed_and_peak_rss_or_is_off_once(odd_login, ssh_base):
    with open_host(login_spec(odd_login, ssh_base, "odd")) as host:
        client = SlurmClient(host)
        found = client.accounting({57: frozenset(range(6))})
        assert client.accounting_off is None
        assert {k: r.to_json() for k, r in found.items()} == {
            (57, 0): {
                "state": "COMPLETED",
                "exit_code": 0,
                "signal": 0,
                "elapsed_s": 12,
                "max_rss_bytes": 10244 * 1024,  # the largest of its steps
            },
            (57, 1): {
                "state": "CANCELLED",  # "by <uid>" is who, not what
                "exit_code": 0,
                "signal": 15,
                "elapsed_s": 7,
                "max_rss_bytes": int(2.5 * 1024 * 1024),
            },
            (57, 2): {
                "state": "OUT_OF_MEMORY",
                "exit_code": 0,
                "signal": 125,
                "elapsed_s": 30,
                "max_rss_bytes": 3 * 1024**3 // 2,
            },
        }  # tasks 3-5 are still queued: no record of their own
        # A cluster without accounting: asked once, then the client stops asking.
        assert client.accounting({58: frozenset({0})}) is None
        assert client.accounting_off == "sacct: Slurm accounting storage is disabled"
        assert not client.accounting_unreadable
        assert client.accounting({57: frozenset(range(6))}) is None
        # An answer out of shape: accounting is optional, so it is off too, saying why.
        unread = SlurmClient(host)
        assert unread.accounting({57: frozenset({1, 2})}) is None
        assert unread.accounting_unreadable and unread.accounting_off == (
            "sacct's answer was unreadable: odd: sacct line 1: task 57_0 is not one asked"
        )
    assert (odd_login.bin_dir / "asked").read_text() == "x\n"


@pytest.fixture(scope="module")
def accounted_login(ssh_base, user_key, tmp_path_factory):
    """A login node of a cluster with accounting whose squeue has forgotten job 57 (its
    MinJobAge passed) and whose sacct remembers it (`SACCT_ANSWER`)."""
    bin_dir = tmp_path_factory.mktemp("accounted-slurm-bin")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").write_text("#!/bin/sh\ncat >/dev/null\necho 57\n")
    (bin_dir / "sacct").write_text(FAKE_SACCT)
    for tool in ("squeue", "sbatch", "sacct"):
        (bin_dir / tool).chmod(0o755)
    server = start_sshd(ssh_base, "accounted-login", (f"SetEnv PATH={bin_dir}:/usr/bin:/bin",))
    yield server
    server.stop()


def test_tasks_squeue_forgot_end_as_sacct_says_with_elapsed_and_rss(
    accounted_login, ssh_base, tmp_path
):
    """Without sacct these would be LOST (no exit record either); with it each ends in its
    real state, not retried where that state is final, and carries sacct's record."""
    plan = ArrayPlan(SlurmRole(shared=str(tmp_path), max_retries=1), "acct", 3, ("true",))
    with open_host(login_spec(accounted_login, ssh_base, "acct")) as host:
        status = run_array(SlurmClient(host), plan, timeout=60)
    assert [t.last.state for t in status.tasks] == ["COMPLETED", "CANCELLED", "OUT_OF_MEMORY"]
    assert status.done == (0,) and status.failed == (1, 2) and status.job_ids == (57,)
    assert "by sacct" in status.tasks[1].last.reason
    assert status.accounting == {"source": "sacct"}
    attempts = [t["attempts"] for t in status.to_json()["tasks"]]
    assert [len(a) for a in attempts] == [1, 1, 1]  # final states: no second attempt
    assert [a[0]["accounting"]["elapsed_s"] for a in attempts] == [12, 7, 30]
    assert attempts[2][0]["accounting"]["max_rss_bytes"] == 3 * 1024**3 // 2


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("57_0|COMPLETED|0:0|12", "has 4 fields, not 5"),
        ("57_0;x|COMPLETED|0:0|12|", "job id '57_0;x' is not an array task"),
        ("58_0|COMPLETED|0:0|12|", "task 58_0 is not one asked"),
        ("57_0|COMPLETE|0:0|12|", "state 'COMPLETE' of task 57_0"),
        ("57_0|COMPLETED|0:999|12|", "exit code '0:999' of task 57_0"),
        ("57_0|COMPLETED|0:0|00:00:12|", "elapsed '00:00:12' of task 57_0"),
        ("57_0.batch|COMPLETED|0:0|12|10X", "MaxRSS '10X' is not a size"),
        ("57_0|COMPLETED|0:0|12|\n57_0|FAILED|1:0|12|", "sacct listed task 57_0 twice"),
    ],
)
def test_odd_sacct_answers_are_refused_naming_host_and_field(line, field):
    with pytest.raises(SlurmError) as err:
        answers.accounting("h", line + "\n", {57: frozenset({0})})
    assert str(err.value).startswith("h: sacct") and field in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(SlurmError, match="more than"):
        answers.accounting("h", "x" * (answers.ACCOUNT_MAX_BYTES + 1), {57: frozenset({0})})


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (41, "node list 'n1;reboot'"),
        (42, "state 'RUNNNING'"),
        (43, "task 43_9 is not one dflash submitted"),
        (44, "has 4 fields, not 5"),
    ],
)
def test_odd_squeue_answers_are_refused_naming_host_and_field(odd_login, ssh_base, job, field):
    with open_host(login_spec(odd_login, ssh_base, "odd")) as host:
        with pytest.raises(SlurmError) as err:
            SlurmClient(host).queue({job: frozenset({0})})
    assert str(err.value).startswith("odd: squeue")
    assert field in str(err.value) and "\n" not in str(err.value)


def test_odd_sbatch_job_id_is_refused(odd_login, ssh_base, tmp_path):
    plan = ArrayPlan(SlurmRole(shared=str(tmp_path)), "odd", 2, ("true",))
    with open_host(login_spec(odd_login, ssh_base, "odd")) as host:
        with pytest.raises(SlurmError, match=r"^odd: sbatch answered a job id that is not a"):
            SlurmClient(host).submit(plan, plan.task_ids)


def test_odd_exit_records_are_refused():
    with pytest.raises(SlurmError, match="^h: the job folder's exit record line '0.7.exit 999'"):
        answers.exit_codes("h", "0.7.exit 999\n", {(7, 0)})
    with pytest.raises(SlurmError, match="^h: the job folder's exit record line '1.7.exit 0'"):
        answers.exit_codes("h", "1.7.exit 0\n", {(7, 0)})
    assert answers.exit_codes("h", "0.7.exit 0\n", {(7, 0)}) == {(7, 0): 0}


# ---- the plan and the role ------------------------------------------------------------


def test_plan_renders_one_quoted_sbatch_with_the_roles_limits(tmp_path):
    role = SlurmRole.from_mapping(
        {
            "shared": "/scratch/team a",
            "partition": "cpu,cpu-long",
            "account": "proj-7",
            "time_limit": "1-02:30:00",
            "cpus_per_task": 4,
            "mem_per_task": "1.5G",
        }
    )
    plan = ArrayPlan(role, "run-1", 64, ("python3", "-c", "print('$HOME')"))
    argv = plan.sbatch_argv([0, 1, 2, 5, 63])
    assert argv[:2] == ["sbatch", "--parsable"]
    for flag in (
        "--array=0-2,5,63",
        "--no-requeue",
        "--time=1590",
        "--cpus-per-task=4",
        "--mem=1536M",
        "--partition=cpu,cpu-long",
        "--account=proj-7",
        "--chdir=/scratch/team a/run-1",
    ):
        assert flag in argv
    assert "python3 -c 'print('\"'\"'$HOME'\"'\"')'" in plan.script()
    assert array_spec([3]) == "3" and array_spec([0, 2, 3, 4, 9, 10]) == "0,2-4,9-10"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"partition": "x"}, "slurm: missing required key 'shared'"),
        ({"shared": "scratch"}, "slurm.shared: 'scratch' is not an absolute"),
        ({"shared": "/s/%j"}, "slurm.shared: '/s/%j' is not an absolute"),
        ({"shared": "/s/../t"}, "slurm.shared: '/s/../t' is not an absolute"),
        ({"shared": "/s", "partition": "a b"}, "slurm.partition: 'a b' is not a Slurm"),
        ({"shared": "/s", "account": "$(id)"}, "slurm.account: '$(id)' is not a Slurm"),
        ({"shared": "/s", "time_limit": "1:2:3:4"}, "slurm.time_limit: not a Slurm time"),
        ({"shared": "/s", "mem_per_task": "lots"}, "slurm.mem_per_task: not a size"),
        ({"shared": "/s", "cpus_per_task": 0}, "slurm.cpus_per_task: 0 is not a whole"),
        ({"shared": "/s", "max_retries": -1}, "slurm.max_retries: -1 is not a whole"),
        ({"shared": "/s", "nodes": 3}, "slurm: unknown key 'nodes'"),
    ],
)
def test_bad_role_values_are_one_line_naming_the_key(values, message):
    with pytest.raises(SlurmError) as err:
        SlurmRole.from_mapping(values)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_plan_values_are_refused(tmp_path):
    role = SlurmRole(shared=str(tmp_path))
    for kwargs, message in (
        ({"name": "a/b"}, "name: 'a/b' is not a job name"),
        ({"tasks": 0}, "tasks: 0 is not between 1 and 1000"),
        ({"command": ()}, "command: expected a non-empty tuple"),
    ):
        args = {"name": "ok", "tasks": 2, "command": ("true",), **kwargs}
        with pytest.raises(SlurmError, match=f"^{message}"):
            ArrayPlan(role, **args)
    with pytest.raises(SlurmError, match="not a non-empty subset of 0..1"):
        ArrayPlan(role, "ok", 2, ("true",)).sbatch_argv([2])
