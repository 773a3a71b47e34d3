"""What does Slurm add per array and per task, on the loopback cluster?

Starts the tests' loopback cluster (`orchestrator.demo.slurm`: munged, slurmctld, two
slurmd nodes declared with enough CPUs that every task runs at once) and a loopback sshd as
its login node, and measures, all in one run, against baselines from the same run:

- cluster start-up (daemons started to every node idle) against one sshd's start-up;
- an array of N tasks through `orchestrator.slurm.array.ArrayRun` over SSH (each task ``date``s
  its start into the shared folder): sbatch returned -> first task started, -> last task
  started, -> the controller saw every task done; against one SSH round trip (``true``) and
  against running the same task over SSH directly;
- per-task launch overhead: (last start - first start) / (N - 1) for the largest N;
- one ``squeue`` look for N tasks against one for 1 task.

    python benchmarks/slurm_startup.py [--tasks 1,16,64] [--repeats 3] [--sched-params ...]

Nothing is asserted; the figures are printed with the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from common.measure import load_avg, median_seconds

from orchestrator.demo.slurm import SlurmCluster, missing_programs
from orchestrator.demo.sshd import SSHServer, keygen
from orchestrator.inventory import HostSpec
from orchestrator.slurm.array import ArrayRun, ArrayStatus
from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.plan import ArrayPlan
from orchestrator.slurm.role import SlurmRole
from orchestrator.transport.hosts import open_host

TASK = 'date +%s.%N > "$1/start.$SLURM_ARRAY_TASK_ID"\n'


def one_array(client: SlurmClient, shared: Path, tasks: int) -> dict:
    """Run one array of `tasks` trivial tasks; its latencies in seconds (wall clock: the
    tasks and the controller share this machine's clock)."""
    name = f"b{tasks}-{uuid.uuid4().hex[:8]}"
    out = shared / name
    out.mkdir()
    role = SlurmRole(shared=str(shared / "jobs"), mem_per_task_mib=16, poll_seconds=0.05)
    plan = ArrayPlan(role, name, tasks, ("/bin/sh", str(shared / "task.sh"), str(out)))
    seen_done: list[float] = []

    def on_update(status: ArrayStatus) -> None:
        if status.finished and not seen_done:
            seen_done.append(time.time())

    t_start = time.time()
    run = ArrayRun(client, plan)
    run.start()  # the job folder (one SSH command), then sbatch (one more)
    t0 = time.time()
    status = run.wait(timeout=300, on_update=on_update)
    if status.failed:
        raise SystemExit(status.failure_line())
    starts = sorted(float((out / f"start.{i}").read_text()) for i in range(tasks))
    return {
        "submit": t0 - t_start,
        "first": starts[0] - t0,
        "last": starts[-1] - t0,
        "done": seen_done[0] - t0,
        "spread": starts[-1] - starts[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="1,16,64", help="array sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="arrays per size (median)")
    ap.add_argument(
        "--sched-params",
        default="",
        help="SchedulerParameters for slurm.conf (default: Slurm's own defaults)",
    )
    args = ap.parse_args()
    sizes = [int(x) for x in args.tasks.split(",")]
    if missing_programs():
        print(
            f"skipped: missing {', '.join(missing_programs())} (bash scripts/setup.sh --for tests)"
        )
        return 0

    base = Path(tempfile.mkdtemp(prefix="dflash-slurm-bench-"))
    key = keygen(base / "id")
    (base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    print(f"load avg before: {load_avg()}")
    cpus = max(1, -(-max(sizes) // 2))
    settings = {"SchedulerParameters": args.sched_params} if args.sched_params else {}

    t = time.perf_counter()
    probe_sshd = SSHServer.start(base, "probe", base / "authorized_keys")
    sshd_start = time.perf_counter() - t
    probe_sshd.stop()

    cluster = SlurmCluster.start(nodes=2, cpus=cpus, memory_mb=64 * 1024, **settings)
    login = None
    try:
        login = SSHServer.start(
            base, "login", base / "authorized_keys", cluster.login_sshd_config()
        )
        (base / "known_hosts").write_text(login.known_hosts_line())
        (cluster.shared / "task.sh").write_text(TASK)
        spec = HostSpec(
            name="login",
            hostname="127.0.0.1",
            port=login.port,
            user=os.environ.get("USER") or "root",
            identity_file=str(key),
            known_hosts=str(base / "known_hosts"),
        )
        with open_host(spec) as host:
            client = SlurmClient(host)
            host.run("true")  # log in once: the round trips below are on an open connection
            rtt = median_seconds(lambda: host.run("true"), 20)
            direct = median_seconds(
                lambda: host.run(["/bin/sh", str(cluster.shared / "task.sh"), "/tmp"]), 10
            )
            print(
                f"cluster start-up: {cluster.started_in:.2f} s = "
                f"{cluster.started_in / sshd_start:.1f}x one sshd's start-up ({sshd_start:.2f} s)"
            )
            print(
                f"baselines: SSH round trip {rtt * 1000:.1f} ms; the task run directly over "
                f"SSH {direct * 1000:.1f} ms"
            )
            print(f"SchedulerParameters: {args.sched_params or '(Slurm defaults)'}")
            rows = {}
            for n in sizes:
                runs = [one_array(client, cluster.shared, n) for _ in range(args.repeats)]
                rows[n] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                r = rows[n]
                print(
                    f"{n:3d} tasks: folder + sbatch {r['submit']:.2f} s; "
                    f"sbatch -> first task started {r['first']:.2f} s "
                    f"({r['first'] / rtt:.0f}x RTT), -> last started {r['last']:.2f} s, "
                    f"-> all seen done {r['done']:.2f} s ({r['done'] / direct:.0f}x the task "
                    f"over SSH); median of {args.repeats}"
                )
            big = max(sizes)
            if big > 1:
                per_task = rows[big]["spread"] / (big - 1)
                print(
                    f"per-task launch overhead ({big} tasks, all started at once): "
                    f"{per_task * 1000:.1f} ms = {per_task / rtt:.2f}x RTT"
                )
                # one squeue look: a finished array of `big` tasks vs one of 1 task
                jobs = {}
                for name, n in (("probe1", 1), ("probeN", big)):
                    plan = ArrayPlan(
                        SlurmRole(shared=str(cluster.shared / "jobs")), name, n, ("true",)
                    )
                    client.make_folder(plan)
                    jobs[n] = (client.submit(plan, plan.task_ids), frozenset(plan.task_ids))
                small_job = jobs[1][0]
                big_job = jobs[big][0]
                asked = {small_job: frozenset({0})}
                one_look = median_seconds(lambda: client.queue(asked), 10)
                asked_big = {big_job: jobs[big][1]}
                big_look = median_seconds(lambda: client.queue(asked_big), 10)
                print(
                    f"one squeue look: {big} tasks {big_look * 1000:.1f} ms vs 1 task "
                    f"{one_look * 1000:.1f} ms ({big_look / one_look:.2f}x)"
                )
                cluster.drain_queue()
    finally:
        if login is not None:
            login.stop()
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(f"load avg after: {load_avg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
