"""The loopback OpenSSH server the tests start (`orchestrator.demo.sshd`, shared with the
benchmarks), under the names the tests import."""

from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.demo.sshd import SSHD as SSHD
from orchestrator.demo.sshd import SSHServer as SSHServer
from orchestrator.demo.sshd import account_home as account_home
from orchestrator.demo.sshd import clear_stale_pyenv_lock as clear_stale_pyenv_lock
from orchestrator.demo.sshd import free_port as free_port
from orchestrator.demo.sshd import keygen as keygen
from orchestrator.demo.sshd import ssh_host_entry as ssh_host_entry
from orchestrator.demo.sshd import start_sshd as start_sshd


def eval_host_inventory(make_inventory, sshd: SSHServer, ssh_base, role: dict, results):
    """An inventory of one loopback eval host, `sshd`, in the eval `role`, its results dir
    `results` (written by conftest's `make_inventory`; returns its path)."""
    return make_inventory(
        hosts={"evalhost": ssh_host_entry(sshd, ssh_base, roles={"eval": role})},
        defaults={"eval_host": "evalhost", "results_dir": str(results)},
    )


@contextmanager
def sshd_hosts(ssh_base, prefix: str, names) -> Iterator[dict[str, SSHServer]]:
    """A loopback sshd per name (``prefix-name``), stopped on leaving."""
    servers: dict[str, SSHServer] = {}
    try:
        for name in names:
            servers[name] = start_sshd(ssh_base, f"{prefix}-{name}")
        yield servers
    finally:
        for server in servers.values():
            server.stop()
