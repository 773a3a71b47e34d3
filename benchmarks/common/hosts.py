"""Loopback sshd hosts for the benchmarks that go over SSH, as the tests start them
(`orchestrator.demo.sshd`): one user key (``base/id_test``), every host key in
``base/known_hosts``, and an inventory naming them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from orchestrator.demo.sshd import SSHServer, keygen, ssh_host_entry, start_sshd


@contextmanager
def loopback(base: Path, names: tuple[str, ...], extra_config=()) -> Iterator[dict]:
    """sshd servers named ``names`` under ``base`` (name -> `SSHServer`), stopped on exit;
    ``extra_config``: more sshd_config lines for each."""
    key = keygen(base / "id_test")
    (base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    (base / "known_hosts").touch()
    servers: dict[str, SSHServer] = {}
    try:
        for name in names:
            servers[name] = start_sshd(base, name, tuple(extra_config))
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def inventory(base: Path, servers: dict, roles: dict[str, dict], defaults: dict) -> Path:
    """``base/inventory.yaml`` naming each server with its ``roles`` (name -> roles)."""
    hosts = {
        name: ssh_host_entry(s, base, roles=roles.get(name, {})) for name, s in servers.items()
    }
    path = base / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts, "defaults": defaults}))
    return path
