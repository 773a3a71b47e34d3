"""The loopback Slurm cluster the tests run (`orchestrator.demo.slurm`, shared with the
benchmarks), `require_slurm`, which skips the calling test where it cannot run, and
`signal_mid_shard`, which stops the CLI while a shard task runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.demo.slurm import INSTALL_HINT
from orchestrator.demo.slurm import PROGRAMS as PROGRAMS
from orchestrator.demo.slurm import SlurmCluster as SlurmCluster
from orchestrator.demo.slurm import missing_programs as missing_programs
from tests.helpers.cli import ROOT
from tests.helpers.required import unavailable


def require_slurm() -> None:
    """Skip the calling test (or fixture) when this machine cannot run the cluster; under
    CI, whose set-up installs it, fail instead (`unavailable`)."""
    missing = missing_programs()
    if missing:
        unavailable(f"{INSTALL_HINT}: missing {', '.join(missing)}")
    if os.geteuid() != 0:
        unavailable("the loopback Slurm cluster runs its daemons as root (SlurmUser=root)")


def shard_started(shared: Path, tasks: str = "*") -> bool:
    """Whether a task of a shards' array (not a ground truth's) whose job folder in the
    shared folder matches ``tasks`` (e.g. ``*-0-*``: task 0) has started its job."""
    jobs = shared / "work" / "jobs"
    return jobs.is_dir() and any(
        (f / "pid.json").exists() for f in jobs.glob(tasks) if "-gt-" not in f.name
    )


def signal_mid_shard(
    cluster: SlurmCluster, shared: Path, argv: list[str], sig: int, tasks: str = "*"
) -> subprocess.CompletedProcess:
    """Run ``dflash argv`` as its own process, send it ``sig`` once a shard task (of
    ``tasks``, `shard_started`) runs with the array queued, and return how it ended."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        cluster.wait_until(lambda: shard_started(shared, tasks), 600, "no shard task started")
        assert cluster.queue()  # the array is there, running
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
