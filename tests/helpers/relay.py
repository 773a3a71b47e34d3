"""A relay test's own folders on two loopback sshd hosts, and hosts that lie.

`TEnv` gives each test fresh checkpoint, destination and "outside" folders (the last must
never change), writes inventories pointing at them, and makes a host's ``python`` a wrapper
that runs the real host-side command and rewrites its JSON scan answer (or the scan in
relay-send's ready frame): a lying host made of real parts, with nothing of the controller
mocked. The ``tenv`` fixture builds one.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.inventory import load_inventory
from orchestrator.relay.run import RelayOptions, relay
from tests.helpers.cli import dflash
from tests.helpers.sshd import ssh_host_entry

_n = itertools.count()

WRAPPER = '''#!{real}
"""A host's python that answers relay-scan / relay-lock / relay-send --scan with a
rewritten scan."""
import json, os, subprocess, sys
REAL = {real!r}
args = sys.argv[1:]


def mutate(data):
{body}


cmd = next((a for a in args if a.startswith("relay-")), None)
if cmd == "relay-send" and "--scan" in args:  # the scan rides in its ready frame
    proc = subprocess.Popen([REAL, *args], stdout=subprocess.PIPE)
    n = int.from_bytes(proc.stdout.read(8), "big")
    data = json.loads(proc.stdout.read(n))
    mutate(data)
    out = json.dumps(data).encode()
    sys.stdout.buffer.write(len(out).to_bytes(8, "big") + out)
    sys.stdout.flush()
    for block in iter(lambda: proc.stdout.read1(1 << 20), b""):
        sys.stdout.buffer.write(block)
        sys.stdout.flush()
    sys.exit(proc.wait())
if cmd in ("relay-scan", "relay-lock"):
    proc = subprocess.Popen([REAL, *args], stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    data = json.loads(line)
    mutate(data["scan"] if cmd == "relay-lock" and "scan" in data else data)
    sys.stdout.write(json.dumps(data) + "\\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(proc.stdout.read())
    sys.exit(proc.wait())
os.execv(REAL, [REAL, *args])
'''


class TEnv:
    """One test's folders on the two sshd hosts, and inventories pointing at them."""

    def __init__(self, trainer, evalh, ssh_base: Path, tmp: Path):
        n = next(_n)
        self.trainer, self.evalh, self.ssh_base, self.tmp = trainer, evalh, ssh_base, tmp
        self.ckpt = trainer.root / f"tckpt-{os.getpid()}-{n}"
        self.dst = evalh.root / f"tdrafters-{os.getpid()}-{n}"
        self.outside = evalh.root / f"toutside-{os.getpid()}-{n}"  # must never change
        for d in (self.ckpt, self.dst, self.outside):
            d.mkdir()
        (self.outside / "sentinel.bin").write_bytes(b"keep me")
        self.trainer_py: str | None = None
        self.eval_py: str | None = None
        self.eval_drafters: Path = self.dst
        self.eval_role: dict = {}
        self.eval_python: str | None = None

    def wrapper(self, body: str) -> str:
        """A python for a host: runs the real one, rewriting scan answers with `body`
        (statements on `data`, the scan JSON)."""
        path = self.tmp / f"python-{next(_n)}"
        lines = "\n".join("    " + ln for ln in body.strip().splitlines())
        path.write_text(WRAPPER.format(real=sys.executable, body=lines))
        path.chmod(0o755)
        return str(path)

    @property
    def inventory_path(self) -> Path:
        trainer = ssh_host_entry(
            self.trainer, self.ssh_base, roles={"trainer": {"checkpoints": str(self.ckpt)}}
        )
        evalh = ssh_host_entry(
            self.evalh,
            self.ssh_base,
            roles={"eval": {"drafters": str(self.eval_drafters), **self.eval_role}},
        )
        if self.trainer_py:
            trainer["python"] = self.trainer_py
        if self.eval_py:
            evalh["python"] = self.eval_py
        path = self.tmp / "inventory.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "hosts": {"trainer": trainer, "evalhost": evalh},
                    "defaults": {"relay_from": "trainer", "relay_to": "evalhost"},
                },
                sort_keys=False,
            )
        )
        return path

    def relay(self, **opts):
        return relay(
            load_inventory(self.inventory_path), "trainer", ["evalhost"], RelayOptions(**opts)
        )

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return dflash(
            "relay", "--inventory", str(self.inventory_path), "--json", *args, timeout=timeout
        )

    def outside_intact(self) -> None:
        """Nothing was written outside the destination folder on the eval host."""
        assert sorted(p.name for p in self.outside.iterdir()) == ["sentinel.bin"]
        assert (self.outside / "sentinel.bin").read_bytes() == b"keep me"
