"""The loopback Slurm cluster the tests run (`orchestrator.demo.slurm`, shared with the
benchmarks), and `require_slurm`, which skips the calling test where it cannot run."""

from __future__ import annotations

import os

from orchestrator.demo.slurm import INSTALL_HINT
from orchestrator.demo.slurm import PROGRAMS as PROGRAMS
from orchestrator.demo.slurm import SlurmCluster as SlurmCluster
from orchestrator.demo.slurm import missing_programs as missing_programs
from tests.helpers.required import unavailable


def require_slurm() -> None:
    """Skip the calling test (or fixture) when this machine cannot run the cluster; under
    CI, whose set-up installs it, fail instead (`unavailable`)."""
    missing = missing_programs()
    if missing:
        unavailable(f"{INSTALL_HINT}: missing {', '.join(missing)}")
    if os.geteuid() != 0:
        unavailable("the loopback Slurm cluster runs its daemons as root (SlurmUser=root)")
