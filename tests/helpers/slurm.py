"""The loopback Slurm cluster the tests run (`orchestrator.demo.slurm`, shared with the
benchmarks), `require_slurm`, which skips the calling test where it cannot run,
`signal_mid_shard`, which stops the CLI while a shard task runs, `MidRun`, which acts on a
task mid-sample, and `FaultyCommands`: the cluster's own commands, wrapped to misbehave
on demand (a squeue that keeps listing finished tasks as running, or forgets one; a
scancel that hangs; a garbled sacct)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.demo.slurm import INSTALL_HINT
from orchestrator.demo.slurm import PROGRAMS as PROGRAMS
from orchestrator.demo.slurm import SlurmCluster as SlurmCluster
from orchestrator.demo.slurm import missing_programs as missing_programs
from orchestrator.inventory import HostSpec
from orchestrator.slurm.plan import ArrayPlan
from orchestrator.slurm.role import SlurmRole
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


# Wrappers around the cluster's own commands, on a login node whose PATH puts them first:
# each does what the real command does unless its switch (a file beside it) is on.
_WRAPPERS = {
    # "running": finished tasks listed as RUNNING; "hide": lines matching its patterns
    # (``^57\|1\|``) left out, as a scheduler that forgot them
    "squeue": """out=$("{real}" "$@") || exit $?
if [ -e "$d/running" ]; then out=$(printf '%s\\n' "$out" | sed 's/|COMPLETED|/|RUNNING|/'); fi
if [ -s "$d/hide" ]; then out=$(printf '%s\\n' "$out" | grep -v -E -f "$d/hide"); fi
if [ -n "$out" ]; then printf '%s\\n' "$out"; fi
exit 0
""",
    # every call logged; "hang": no answer (short sleeps, ends when the switch goes off)
    "scancel": """printf '%s\\n' "$*" >> "$d/scancel.log"
i=0
while [ -e "$d/hang" ] && [ $i -lt 1800 ]; do sleep 0.1; i=$((i+1)); done
exec "{real}" "$@"
""",
    # "garble": an answer in no shape dflash asked for, exit 0
    "sacct": """if [ -e "$d/garble" ]; then echo 'JobID|State|what?'; exit 0; fi
exec "{real}" "$@"
""",
}


class FaultyCommands:
    """A folder of `_WRAPPERS` over this machine's Slurm commands, and their switches."""

    def __init__(self, folder: Path):
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        for name, body in _WRAPPERS.items():
            real = shutil.which(name)
            assert real, f"{name} is not installed"
            path = folder / name
            path.write_text(f'#!/bin/sh\nd="{folder}"\n' + body.format(real=real))
            path.chmod(0o755)

    def sshd_config(self, cluster: SlurmCluster) -> tuple[str, ...]:
        """sshd_config lines of a login node of `cluster` whose Slurm commands are these."""
        return (f"SetEnv SLURM_CONF={cluster.conf} PATH={self.dir}:/usr/bin:/bin",)

    def on(self, switch: str, text: str = "") -> None:
        (self.dir / switch).write_text(text)

    def off(self) -> None:
        """Every switch off, the scancel log emptied."""
        for name in ("running", "hide", "hang", "garble", "scancel.log"):
            (self.dir / name).unlink(missing_ok=True)

    def cancelled(self) -> list[str]:
        """Each scancel's arguments, in order."""
        log = self.dir / "scancel.log"
        return log.read_text().splitlines() if log.exists() else []


def long_ground_truth(path: Path) -> None:
    """Planned over 2 tasks by tokens: g1, g2 -> task 0; g0 (short), g3 -> task 1, whose
    long second sample is seconds of work after its first one's event."""
    rng = random.Random(5)
    with open(path, "w") as fh:
        for i, n in enumerate([40, 2980, 3000, 3000]):
            record = {
                "id": f"g{i}",
                "prompt_ids": [rng.randrange(8, 300) for _ in range(12)],
                "completion_ids": [rng.randrange(8, 300) for _ in range(n)],
            }
            fh.write(json.dumps(record) + "\n")


def sampled_ground_truth(path: Path) -> None:
    """Two sampled completions of each of three prompts (``id`` ``q<p>#<k>``, with
    ``prompt_id`` and ``index``), token ids the tiny target knows, of 8-15 tokens."""
    rng = random.Random(11)
    with open(path, "w") as fh:
        for p in range(3):
            prompt = [rng.randrange(8, 300) for _ in range(10)]
            for k in range(2):
                record = {
                    "id": f"q{p}#{k}",
                    "prompt_id": f"q{p}",
                    "index": k,
                    "prompt_ids": prompt,
                    "completion_ids": [rng.randrange(8, 300) for _ in range(8 + 3 * p + k)],
                }
                fh.write(json.dumps(record) + "\n")


class MidRun:
    """Waits (in a thread) until task 1's first attempt of a shards' array has evaluated a
    sample (its job folder in `shared`, ``<run>-1-<array job>``, or ``run_id``'s), then does
    `act(array job id, the job's runner pid)` to it once."""

    def __init__(self, shared: Path, act, run_id: str | None = None):
        self.jobs = shared / "work" / "jobs"
        self.name = re.compile(rf"{re.escape(run_id) if run_id else '.+'}-1-([0-9]+)")
        self.act = act
        self.done: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 600
        while not self._stop.is_set() and time.monotonic() < deadline:
            folders = self.jobs.iterdir() if self.jobs.is_dir() else ()
            for folder in sorted(folders):
                m = self.name.fullmatch(folder.name)
                if not m or "-gt-" in folder.name:
                    continue
                events, pid = folder / "events.jsonl", folder / "pid.json"
                if events.exists() and pid.exists() and '"sample"' in events.read_text():
                    self.act(m.group(1), json.loads(pid.read_text())["pid"])
                    self.done.append(folder.name)
                    return
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


TASK = """#!/bin/sh
# A test task: out/<task> names its task, array job and node. With hold/<task> there, the
# attempt that takes it records its pid and waits (short sleeps: nothing outlives a kill)
# until release/<task> appears or 60 s pass.
d=$1; t=$SLURM_ARRAY_TASK_ID
if mv "$d/hold/$t" "$d/held.$t" 2>/dev/null; then
  echo $$ > "$d/pid/$t.partial" && mv "$d/pid/$t.partial" "$d/pid/$t"
  i=0
  while [ ! -e "$d/release/$t" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
echo "task $t job $SLURM_ARRAY_JOB_ID node $SLURMD_NODENAME" > "$d/out/$t"
"""


def login_spec(server, ssh_base: Path, name: str) -> HostSpec:
    """The host spec of a loopback login node `server` (an sshd), named `name`."""
    return HostSpec(
        name=name,
        hostname="127.0.0.1",
        port=server.port,
        user=os.environ.get("USER") or "root",
        identity_file=str(ssh_base / "id_test"),
        known_hosts=str(ssh_base / "known_hosts"),
        connect_timeout=5,
    )


class Work:
    """One test's folder in the shared filesystem: the task script (`TASK`) and its files."""

    def __init__(self, cluster: SlurmCluster, name: str):
        # A space and a '$' in the path: every argument must reach the login node quoted.
        self.root = cluster.shared / f"{name} $x"
        for sub in ("out", "hold", "pid", "release"):
            (self.root / "t" / sub).mkdir(parents=True)
        self.task = self.root / "task.sh"
        self.task.write_text(TASK)
        self.task.chmod(self.task.stat().st_mode | stat.S_IXUSR)

    @property
    def dir(self) -> Path:
        return self.root / "t"

    def plan(self, name: str, tasks: int = 3, **role) -> ArrayPlan:
        role = SlurmRole(
            shared=str(self.root / "jobs"), mem_per_task_mib=64, poll_seconds=0.2, **role
        )
        return ArrayPlan(role, name, tasks, ("/bin/sh", str(self.task), str(self.dir)))

    def hold(self, task: int) -> None:
        (self.dir / "hold" / str(task)).touch()

    def release(self, task: int) -> None:
        (self.dir / "release" / str(task)).touch()

    def pid(self, task: int) -> int | None:
        path = self.dir / "pid" / str(task)
        return int(path.read_text()) if path.exists() else None

    def out(self, task: int) -> str:
        return (self.dir / "out" / str(task)).read_text().strip()
