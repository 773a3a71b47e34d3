"""A real Slurm cluster on loopback: munged, slurmctld and slurmd nodes in one folder
(docs/slurm.md, "The loopback cluster")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from orchestrator.demo.sshd import free_port

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
INSTALL_HINT = "slurm-wlm and munge are not installed (bash scripts/setup.sh --for tests)"


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    base: Path
    conf: Path
    nodes: tuple[str, ...]
    settings: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    started_in: float = 0.0  # until every node is idle

    @classmethod
    def start(
        cls,
        nodes: int = 2,
        cpus: int = 2,
        memory_mb: int = 2048,
        timeout: float = 60.0,
        **settings: str,
    ) -> SlurmCluster:
        """Start a cluster of `nodes` declared nodes; `settings` override slurm.conf lines."""
        t0 = time.monotonic()
        # Not under pytest's 0700 tmp tree: munged insists on a world-searchable folder.
        base = Path(tempfile.mkdtemp(prefix="dflash-slurm-"))
        base.chmod(0o755)
        names = tuple(f"n{i + 1}" for i in range(nodes))
        cluster = cls(base=base, conf=base / "slurm.conf", nodes=names, settings=dict(settings))
        try:
            cluster._write_config(cpus, memory_mb)
            cluster._start_munge()
            cluster._spawn("slurmctld", [_program("slurmctld"), "-D", "-i"])
            for name in names:
                cluster._spawn(f"slurmd-{name}", [_program("slurmd"), "-D", "-N", name])
            cluster.wait_nodes("idle", timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except BaseException:
            cluster.stop()
            raise
        cluster.started_in = time.monotonic() - t0
        return cluster

    # -- configuration ------------------------------------------------------------------
    def _write_config(self, cpus: int, memory_mb: int) -> None:
        b = self.base
        for d in ("state", "spool", "log", "shared"):
            (b / d).mkdir()
        (b / "shared").chmod(0o777)
        host = socket.gethostname().split(".")[0]
        lines = {
            "ClusterName": "dflashtest",
            "SlurmctldHost": "localhost(127.0.0.1)",
            "SlurmctldPort": str(free_port()),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={b / 'munge' / 'munge.socket'}",
            "StateSaveLocation": str(b / "state"),
            "SlurmdSpoolDir": str(b / "spool" / "%n"),
            "SlurmctldPidFile": str(b / "slurmctld.pid"),
            "SlurmdPidFile": str(b / "slurmd-%n.pid"),
            "SlurmctldLogFile": str(b / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(b / "log" / "slurmd-%n.log"),
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/filetxt",
            "JobCompLoc": str(b / "jobcomp.txt"),
            "SwitchType": "switch/none",
            "MpiDefault": "none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU_Memory",
            "SlurmdParameters": "config_overrides",
            "ReturnToService": "1",
            "KillWait": "5",
            "MinJobAge": "300",
            "SchedulerType": "sched/backfill",
        }
        lines.update(self.settings)
        text = [f"{k}={v}" for k, v in lines.items()]
        for name in self.nodes:
            text.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} "
                f"CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
            )
        text.append(
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(text) + "\n")

    def reconfigure(self, **settings: str) -> None:
        """Change slurm.conf lines and have every daemon read it again."""
        text = self.conf.read_text().splitlines()
        for key, value in settings.items():
            text = [ln for ln in text if not ln.startswith(f"{key}=")]
            text.insert(0, f"{key}={value}")
        self.conf.write_text("\n".join(text) + "\n")
        self.scontrol("reconfigure")

    @contextmanager
    def configured(self, **settings: str) -> Iterator[None]:
        """`settings` in force for a block, then the lines before it again."""
        before = self.conf.read_text()
        self.reconfigure(**settings)
        try:
            yield
        finally:
            self.conf.write_text(before)
            self.scontrol("reconfigure")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def shared(self) -> Path:
        """The loopback 'shared filesystem' every node and the login node see."""
        return self.base / "shared"

    def login_sshd_config(self) -> tuple[str, ...]:
        """sshd_config lines that make an sshd a login node of this cluster."""
        return (f"SetEnv SLURM_CONF={self.conf}",)

    # -- daemons ------------------------------------------------------------------------
    def _start_munge(self) -> None:
        d = self.base / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        sock = d / "munge.socket"
        self._spawn(
            "munged",
            [
                _program("munged"),
                "-F",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--log-file={d / 'munged.log'}",
                f"--pid-file={d / 'munged.pid'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
        )
        self.wait_until(lambda: sock.exists(), 15.0, "munged did not make its socket")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / "log" / f"{name}.stderr", "wb")
        self.procs[name] = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()

    def wait_until(self, ok, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log(name)}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{what} within {timeout:g}s")
            time.sleep(0.1)

    def log(self, name: str, lines: int = 5) -> str:
        """The last lines a daemon wrote."""
        for path in (self.base / "log" / f"{name}.stderr", self.base / "log" / f"{name}.log"):
            if path.exists() and path.stat().st_size:
                return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
        return "(no output)"

    # -- commands -----------------------------------------------------------------------
    def command(self, *argv: str, check: bool = True, timeout: float = 30.0) -> str:
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode:
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def scontrol(self, *args: str) -> str:
        return self.command("scontrol", *args)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo says it."""
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = {}
        for line in out.splitlines():
            name, state = line.split()
            states[name] = state.rstrip("*~#!%$@^-")
        return states

    def wait_nodes(self, state: str, timeout: float = 30.0) -> None:
        self.wait_until(
            lambda: all(self.node_states().get(n) == state for n in self.nodes),
            timeout,
            f"nodes {', '.join(self.nodes)} were not all {state}: {self.node_states()}",
        )

    def set_node(self, node: str, state: str, reason: str = "test") -> None:
        args = [f"nodename={node}", f"state={state}"]
        if state.upper() in ("DOWN", "DRAIN"):
            args.append(f"reason={reason}")
        self.scontrol("update", *args)

    def queue(self) -> list[str]:
        """``<job id> <state>`` of every unfinished job."""
        return self.command("squeue", "-h", "-r", "-o", "%i %T").splitlines()

    def drain_queue(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until none is listed (as root: anyone's)."""
        if self.queue():
            self.command("scancel", "--user=root", check=False)
            self.wait_until(lambda: not self.queue(), timeout, f"jobs still queued: {self.queue()}")

    def resume_nodes(self) -> None:
        """Resume nodes a test set down and wait until all are idle."""
        for node, state in self.node_states().items():
            if state in ("down", "drain", "drng"):
                self.set_node(node, "RESUME")
        self.wait_nodes("idle")

    # -- the end ------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel jobs, end the daemons and strays of this cluster, remove the folder."""
        try:
            if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
                self.drain_queue(timeout=20.0)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass  # ending the daemons below ends the jobs too
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._end_strays()
        shutil.rmtree(self.base, ignore_errors=True)

    def strays(self) -> list[psutil.Process]:
        """Processes of this cluster that are none of its daemons: a job's (by its
        SLURM_CONF) and job steps' (``slurmstepd`` keeps its node's log open)."""
        mine, base = str(self.conf), str(self.base) + os.sep
        daemons = {p.pid for p in self.procs.values()} | {os.getpid()}
        found = []
        for p in psutil.process_iter():
            try:
                if p.pid in daemons:
                    continue
                if p.environ().get("SLURM_CONF") == mine or any(
                    f.path.startswith(base) for f in p.open_files()
                ):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def _end_strays(self) -> None:
        victims = self.strays()
        for p in victims:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=5)
