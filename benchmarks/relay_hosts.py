"""Two loopback sshd hosts (trainer and eval host) for the relay benchmarks.

`relay_hosts(base)` compiles the checkout (`compiled`), starts two OpenSSH servers
(`orchestrator.demo.sshd`) under `base`, with one user key, a known_hosts file naming both host
keys and an inventory whose defaults relay from the trainer to the eval host; it stops them
(and only them) on exit. Shared by benchmarks/relay.py and benchmarks/relay_kill_resume.py,
so both measure the same set-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from orchestrator.demo.sshd import SSHServer, keygen  # noqa: E402

MiB = 1 << 20


@dataclass
class RelayHosts:
    trainer: SSHServer
    evalhost: SSHServer
    key: Path  # the user's private key
    known: Path  # known_hosts with both host keys
    inventory: Path
    ckpts: Path  # the trainer's checkpoint folder
    drafters: Path  # the eval host's drafters folder

    tree: Path = ROOT  # the checkout whose CLI runs (another one: a same-run baseline)

    @property
    def env(self) -> dict[str, str]:
        """The environment that runs `tree`'s CLI."""
        return {**os.environ, "PYTHONPATH": str(self.tree), "COLUMNS": "200"}

    def cli(self, *args: str) -> list[str]:
        """argv of ``dflash relay --json --inventory INV ARGS`` (the real CLI)."""
        return [
            sys.executable,
            "-m",
            "orchestrator",
            "relay",
            "--json",
            "--inventory",
            str(self.inventory),
            *args,
        ]

    def relay(self, *args: str) -> tuple[float, subprocess.CompletedProcess]:
        """Run the CLI to its end; (wall seconds, the finished process)."""
        t = time.perf_counter()
        proc = subprocess.run(self.cli(*args), capture_output=True, text=True, env=self.env)
        return time.perf_counter() - t, proc

    def _options(self, cipher: str) -> list[str]:
        """What ``ssh`` and ``scp`` both get: no user config, the benchmark's key and
        known_hosts (unknown keys refused), `cipher`."""
        return [
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.known}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-i",
            str(self.key),
            "-c",
            cipher,
        ]

    def ssh_argv(self, server: SSHServer, cipher: str) -> list[str]:
        """``ssh`` to `server` with the benchmark's key, known_hosts and `cipher`."""
        return ["ssh", *self._options(cipher), "-p", str(server.port), "127.0.0.1"]

    def scp_argv(self, cipher: str, legacy: bool) -> list[str]:
        """``scp -3`` between the two hosts (source and target appended by the caller)."""
        return ["scp", "-3", "-q", "-r", *self._options(cipher), *(["-O"] if legacy else [])]


def random_file(path: Path, size: int) -> None:
    """`size` random bytes at `path` (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(16 * MiB, left)
            fh.write(os.urandom(n))
            left -= n


def compiled(root: Path = ROOT) -> None:
    """Write the bytecode of this checkout's `orchestrator` and `remote` (what ``pip install``
    does), so the CLI runs like an installed one: with PYTHONDONTWRITEBYTECODE set (as on
    the test box) every module changed since its last .pyc was compiled again at every CLI
    start, 0.2-0.6 s of each relay's wall time there."""
    import compileall

    for package in ("orchestrator", "remote"):
        compileall.compile_dir(str(root / package), quiet=1)


@contextmanager
def relay_hosts(base: Path, trainer_role: dict | None = None) -> Iterator[RelayHosts]:
    """Start the trainer and eval host sshd servers under `base` and write the inventory
    (`trainer_role` extends the trainer's role; its checkpoints folder is fixed)."""
    compiled()
    key = keygen(base / "id")
    (base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    servers: list[SSHServer] = []
    try:
        for name in ("trainer", "evalhost"):
            servers.append(SSHServer.start(base, name, base / "authorized_keys"))
        trainer, evalhost = servers
        known = base / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in servers))
        ckpts, drafters = trainer.root / "ckpts", evalhost.root / "drafters"
        ckpts.mkdir()
        drafters.mkdir()

        def entry(s: SSHServer, **roles) -> dict:
            return {
                "hostname": "127.0.0.1",
                "port": s.port,
                "user": os.environ.get("USER") or "root",
                "identity_file": str(key),
                "known_hosts": str(known),
                "python": sys.executable,
                "workdir": str(s.root / "dflash"),
                "roles": roles,
            }

        inv = base / "inventory.yaml"
        inv.write_text(
            yaml.safe_dump(
                {
                    "hosts": {
                        "trainer": entry(
                            trainer, trainer={"checkpoints": str(ckpts), **(trainer_role or {})}
                        ),
                        "evalhost": entry(evalhost, eval={"drafters": str(drafters)}),
                    },
                    "defaults": {"relay_from": "trainer", "relay_to": "evalhost"},
                }
            )
        )
        yield RelayHosts(trainer, evalhost, key, known, inv, ckpts, drafters)
    finally:
        for s in servers:
            s.stop()


def load_average() -> str:
    """This machine's 1-minute load average and core count, for printing beside figures."""
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
