"""The relay benchmarks' two loopback hosts (trainer and eval host) and their checkpoints.

`relay_hosts(base)` compiles the checkout (`compiled`), starts the two sshd servers
(`common.hosts`) and writes an inventory whose defaults relay from the trainer to the eval
host; `RelayHosts` runs the real CLI (this checkout's, or a baseline tree's) and ``ssh`` or
``scp`` between them with the benchmark's key. `killed_at_half` and `half_partial` leave a
relay's destination half done, the two ways a resume starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import ROOT
from .hosts import inventory, loopback

MiB = 1 << 20


@dataclass
class RelayHosts:
    trainer: object  # orchestrator.demo.sshd.SSHServer
    evalhost: object
    base: Path  # the key (id_test), known_hosts and the inventory are here
    ckpts: Path  # the trainer's checkpoint folder
    drafters: Path  # the eval host's drafters folder

    tree: Path = ROOT  # the checkout whose CLI runs (another one: a same-run baseline)

    @property
    def env(self) -> dict[str, str]:
        """The environment that runs `tree`'s CLI."""
        return {**os.environ, "PYTHONPATH": str(self.tree), "COLUMNS": "200"}

    def cli(self, *args: str) -> list[str]:
        """argv of ``dflash relay --json --inventory INV ARGS`` (the real CLI)."""
        inv = str(self.base / "inventory.yaml")
        return [sys.executable, "-m", "orchestrator", "relay", "--json", "--inventory", inv, *args]

    def relay(self, *args: str) -> tuple[float, subprocess.CompletedProcess]:
        """Run the CLI to its end; (wall seconds, the finished process)."""
        t = time.perf_counter()
        proc = subprocess.run(self.cli(*args), capture_output=True, text=True, env=self.env)
        return time.perf_counter() - t, proc

    def _options(self, cipher: str) -> list[str]:
        """What ``ssh`` and ``scp`` both get: no user config, the benchmark's key and
        known_hosts (unknown keys refused), ``cipher``."""
        known, key = self.base / "known_hosts", self.base / "id_test"
        options = {"BatchMode": "yes", "UserKnownHostsFile": known, "StrictHostKeyChecking": "yes"}
        flags = [x for k, v in options.items() for x in ("-o", f"{k}={v}")]
        return ["-F", "/dev/null", *flags, "-i", str(key), "-c", cipher]

    def ssh_argv(self, server, cipher: str) -> list[str]:
        """``ssh`` to ``server`` with the benchmark's key, known_hosts and ``cipher``."""
        return ["ssh", *self._options(cipher), "-p", str(server.port), "127.0.0.1"]

    def scp_argv(self, cipher: str, legacy: bool) -> list[str]:
        """``scp -3`` between the two hosts (source and target appended by the caller)."""
        return ["scp", "-3", "-q", "-r", *self._options(cipher), *(["-O"] if legacy else [])]


def random_file(path: Path, size: int) -> None:
    """``size`` random bytes at ``path`` (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(16 * MiB, left)
            fh.write(os.urandom(n))
            left -= n


def compiled(root: Path = ROOT) -> None:
    """Write the bytecode of ``root``'s `orchestrator` and `remote` (what ``pip install``
    does), so the CLI runs like an installed one: with PYTHONDONTWRITEBYTECODE set every
    module changed since its last .pyc compiles again at every CLI start."""
    import compileall

    for package in ("orchestrator", "remote"):
        compileall.compile_dir(str(root / package), quiet=1)


@contextmanager
def relay_hosts(base: Path, trainer_role: dict | None = None) -> Iterator[RelayHosts]:
    """The trainer and eval host under ``base`` and the inventory (``trainer_role`` extends
    the trainer's role; its checkpoints folder is fixed)."""
    compiled()
    with loopback(base, ("trainer", "evalhost")) as servers:
        ckpts = servers["trainer"].root / "ckpts"
        drafters = servers["evalhost"].root / "drafters"
        ckpts.mkdir()
        drafters.mkdir()
        roles = {
            "trainer": {"trainer": {"checkpoints": str(ckpts), **(trainer_role or {})}},
            "evalhost": {"eval": {"drafters": str(drafters)}},
        }
        inventory(base, servers, roles, {"relay_from": "trainer", "relay_to": "evalhost"})
        yield RelayHosts(servers["trainer"], servers["evalhost"], base, ckpts, drafters)


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def half_partial(h: RelayHosts, name: str) -> int:
    """Put the first half of every file of checkpoint ``name`` into the destination's
    partial folder (the bytes a relay cut at 50% leaves, but no saved hash states: the
    source's are removed too, so both hosts hash the kept prefix); the bytes still to send."""
    shutil.rmtree(h.trainer.root / "dflash" / "relay-states", ignore_errors=True)
    src = h.ckpts / name
    partial = h.drafters / f".partial-{name}"
    left = 0
    for f in files_of(src):
        dst = partial / (f.relative_to(src) if src.is_dir() else Path(name))
        dst.parent.mkdir(parents=True, exist_ok=True)
        size = f.stat().st_size
        with open(f, "rb") as fin, open(dst, "wb") as fout:
            fout.write(fin.read(size // 2))
        left += size - size // 2
    return left


def settle(path: Path, size=lambda p: p.stat().st_size if p.exists() else 0) -> int:
    """Wait until the host-side writer of a dropped connection has drained its pipe into
    ``path``; the bytes there then."""
    last = -1
    while (now := size(path)) != last:
        last = now
        time.sleep(0.3)
    return now


def killed_at_half(h: RelayHosts, name: str, size: int) -> int:
    """Start a relay of single-file checkpoint ``name`` and cut it (the eval host's sessions
    killed: a dropped link) once half of it is in the partial folder; the bytes kept."""
    partial = h.drafters / f".partial-{name}" / name
    proc = subprocess.Popen(
        h.cli(name), env=h.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while proc.poll() is None and (partial.stat().st_size if partial.exists() else 0) < size // 2:
        time.sleep(0.002)
    h.evalhost.kill_sessions()
    proc.wait(timeout=120)
    return settle(partial)
