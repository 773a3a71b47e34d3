"""Shared fixtures: real loopback sshd hosts and inventories that point at them.

Session-scoped: one user key, and two sshd servers acting as the trainer (`trainer`) and
the eval host (`evalhost`), each with its own root folder. `make_inventory` writes an
inventory for any set of those servers plus local hosts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.sshd import SSHServer, clear_stale_pyenv_lock, keygen

ROOT = Path(__file__).resolve().parent.parent

# Fixtures shared by several test modules come in through here, never by a test module
# importing them (tests/reval_fixtures.py: tiny target, ground-truth server, prompts).
pytest_plugins = ["tests.reval_fixtures"]


@pytest.fixture(autouse=True)
def _no_stale_pyenv_lock():
    """Tests that kill SSH sessions can leave pyenv's rehash lock behind (see sshd.py)."""
    clear_stale_pyenv_lock()
    yield
    clear_stale_pyenv_lock()


@pytest.fixture(scope="session")
def ssh_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ssh")


@pytest.fixture(scope="session")
def user_key(ssh_base) -> Path:
    key = keygen(ssh_base / "id_test")
    (ssh_base / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    return key


def _start(ssh_base: Path, user_key: Path, name: str):
    server = SSHServer.start(ssh_base, name, ssh_base / "authorized_keys")
    known = ssh_base / "known_hosts"
    with open(known, "a") as fh:
        fh.write(server.known_hosts_line())
    return server


@pytest.fixture(scope="session")
def trainer_sshd(ssh_base, user_key):
    server = _start(ssh_base, user_key, "trainer")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def eval_sshd(ssh_base, user_key):
    server = _start(ssh_base, user_key, "evalhost")
    yield server
    server.stop()


def ssh_host_entry(server: SSHServer, ssh_base: Path, **extra) -> dict:
    """An inventory host entry for a loopback sshd server."""
    entry = {
        "transport": "ssh",
        "hostname": "127.0.0.1",
        "port": server.port,
        "user": os.environ.get("USER") or "root",
        "identity_file": str(ssh_base / "id_test"),
        "known_hosts": str(ssh_base / "known_hosts"),
        "python": sys.executable,
        "workdir": str(server.root / "dflash"),
        "connect_timeout": 5,
    }
    entry.update(extra)
    return entry


@pytest.fixture
def make_inventory(tmp_path, ssh_base):
    """Write an inventory: ``make_inventory(hosts={"name": entry_dict}, defaults={...})``."""

    def write(hosts: dict, defaults: dict | None = None, groups: dict | None = None) -> Path:
        doc = {"hosts": hosts}
        if defaults:
            doc["defaults"] = defaults
        if groups:
            doc["groups"] = groups
        path = tmp_path / "inventory.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write


@pytest.fixture
def two_hosts(trainer_sshd, eval_sshd, ssh_base, make_inventory):
    """An inventory with the trainer and eval sshd hosts in their roles; returns its path."""
    ckpt = trainer_sshd.root / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    drafters = eval_sshd.root / "drafters"
    drafters.mkdir(exist_ok=True)
    return make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                trainer_sshd, ssh_base, roles={"trainer": {"checkpoints": str(ckpt)}}
            ),
            "evalhost": ssh_host_entry(
                eval_sshd, ssh_base, roles={"eval": {"drafters": str(drafters)}}
            ),
        },
        defaults={"relay_from": "trainer", "relay_to": "evalhost", "eval_host": "evalhost"},
    )
