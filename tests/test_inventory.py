"""Inventory validation: each malformed file gives one line naming file, line and key."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.inventory import HostSpec, InventoryError, load_inventory, parse_inventory
from tests.helpers.cli import dflash, one_error_line

GOOD = """\
defaults:
  relay_from: kpro6
  relay_to: ct129
hosts:
  kpro6:
    user: root
    jump: bastion
    python: /opt/venv/bin/python
    roles:
      trainer: {checkpoints: /data/ckpt, complete_rule: marker}
  ct129:
    hostname: 10.0.0.5
    port: 2222
    roles:
      eval: {drafters: /root/drafters, target_model: /root/models/t, threads: 8}
  demo:
    transport: local
groups:
  evals: [ct129, demo]
"""


def test_a_local_host_runs_the_python_that_runs_dflash_an_ssh_host_python3():
    """Without ``python:`` a local host runs this interpreter (the venv's, with torch), not
    whatever ``python3`` PATH finds first; an SSH host keeps ``python3``; a named one wins."""
    text = "hosts:\n  here: {transport: local}\n  named: {transport: local, python: /x/py}\n"
    inv = parse_inventory(text + "  far: {hostname: 10.0.0.9}\n", Path("inv.yaml"))
    assert inv.hosts["here"].python == sys.executable
    assert inv.hosts["named"].python == "/x/py"
    assert inv.hosts["far"].python == "python3"
    assert HostSpec(name="direct", transport="local").python == sys.executable
    assert HostSpec(name="direct").python == "python3"


def test_good_inventory_parses():
    inv = parse_inventory(GOOD, Path("inv.yaml"))
    assert inv.hosts["kpro6"].trainer.checkpoints == "/data/ckpt"
    assert inv.hosts["kpro6"].trainer.complete_rule == "marker"
    assert inv.hosts["ct129"].port == 2222
    assert inv.hosts["ct129"].eval.threads == 8
    assert inv.hosts["demo"].transport == "local"
    assert inv.defaults.relay_to == "ct129"
    assert [h.name for h in inv.expand(["evals", "kpro6"])] == ["ct129", "demo", "kpro6"]


BAD = [
    # (text, expected line, words the message must contain)
    ("hosts:\n  a:\n    port: abc\n", 3, ["hosts.a.port", "port number"]),
    ("hosts:\n  a:\n    prot: 22\n", 3, ["hosts.a", "unknown key 'prot'"]),
    ("hosts:\n  a:\n    transport: telnet\n", 3, ["hosts.a.transport", "one of ssh, local"]),
    ("hostz: {}\n", 1, ["unknown key 'hostz'"]),
    ("defaults: {}\n", 1, ["missing required key 'hosts'"]),
    ("hosts:\n  a: {}\ndefaults:\n  relay_to: b\n", 4, ["defaults.relay_to", "unknown host 'b'"]),
    (
        "hosts:\n  a:\n    roles:\n      trainer: {}\n",
        4,
        ["roles.trainer", "missing required key 'checkpoints'"],
    ),
    ("hosts:\n  a:\n    roles:\n      painter: {x: 1}\n", 4, ["unknown role"]),
    ("hosts:\n  a: {}\ngroups:\n  g: [a, zz]\n", 4, ["groups.g", "unknown host 'zz'"]),
    ("hosts:\n  a:\n    port: 70000\n", 3, ["hosts.a.port"]),
    ("hosts:\n  a:\n    user: [root]\n", 3, ["hosts.a.user", "got a list"]),
    ("hosts:\n  a:\n    port: 1\n    port: 2\n", 4, ["appears twice"]),
    ("hosts: [\n", 2, ["not valid YAML"]),
    ("hosts:\n  a:\n    transport: local\n    jump: b\n", 3, ["local host cannot have a jump"]),
    ("hosts:\n  a:\n    accept_new_host_key: maybe\n", 3, ["true or false"]),
    ("", None, ["empty"]),
    (
        "hosts:\n  login:\n    roles:\n      slurm: {partition: cpu}\n",
        4,
        ["hosts.login.roles.slurm", "missing required key 'shared'"],
    ),
    (
        "hosts:\n  login:\n    roles:\n      slurm:\n        shared: /s\n"
        "        time_limit: '1:2:3:4'\n",
        5,
        ["hosts.login.roles.slurm.time_limit", "not a Slurm time limit"],
    ),
    (
        "hosts:\n  login:\n    roles:\n      slurm: {shared: /s, nodes: [a]}\n",
        4,
        ["hosts.login.roles.slurm.nodes", "single value"],
    ),
]


def test_a_slurm_role_is_read_with_its_own_checks():
    """The login node's role parses into `SlurmRole`, sbatch's forms converted."""
    inv = parse_inventory(
        "hosts:\n  login:\n    hostname: login.example.org\n    roles:\n      slurm:\n"
        "        shared: /scratch/a/dflash\n        time_limit: '1:30:00'\n"
        "        mem_per_task: 4G\n        partition: cpu,cpu-long\n",
        Path("inv.yaml"),
    )
    role = inv.hosts["login"].slurm
    assert role is not None and inv.hosts["login"].eval is None
    assert (role.shared, role.time_limit_minutes, role.mem_per_task_mib) == (
        "/scratch/a/dflash",
        90,
        4096,
    )
    assert role.partition == "cpu,cpu-long"


@pytest.mark.parametrize("text,line,words", BAD)
def test_malformed_inventory_is_one_clear_line(text, line, words):
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, Path("bad.yaml"))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"bad.yaml:{line}:" if line else "bad.yaml")
    for w in words:
        assert w in msg, msg


def test_inventory_search_order(tmp_path, monkeypatch):
    a = tmp_path / "a.yaml"
    a.write_text("hosts:\n  from_flag: {}\n")
    b = tmp_path / "b.yaml"
    b.write_text("hosts:\n  from_env: {}\n")
    (tmp_path / "inventory.yaml").write_text("hosts:\n  from_cwd: {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DFLASH_INVENTORY", str(b))
    assert list(load_inventory(a).hosts) == ["from_flag"]
    assert list(load_inventory(None).hosts) == ["from_env"]
    monkeypatch.delenv("DFLASH_INVENTORY")
    assert list(load_inventory(None).hosts) == ["from_cwd"]
    (tmp_path / "inventory.yaml").unlink()
    with pytest.raises(InventoryError, match="no inventory"):
        load_inventory(None)


def test_a_clone_ships_an_example_and_says_to_copy_it(tmp_path):
    """Issue 48.8: the clone's tracked inventory.yaml (the project's own hosts) was what a
    user running from the clone picked up (``kpro6 does not resolve``). The clone ships
    inventory.example.yaml instead, valid as it is; with no inventory.yaml beside it,
    dflash says in one line to copy it, before anything connects."""
    root = Path(__file__).resolve().parent.parent
    example = root / "inventory.example.yaml"
    inv = load_inventory(example)
    assert inv.hosts["trainer"].trainer is not None and inv.hosts["evalbox"].eval is not None
    tracked = subprocess.run(
        ["git", "ls-files", "inventory.yaml"], cwd=root, capture_output=True, text=True
    )
    assert tracked.returncode == 0 and tracked.stdout == ""  # nothing of the project's own
    shutil.copy(example, tmp_path / example.name)
    proc = dflash("hosts", "check", cwd=tmp_path, env={"DFLASH_INVENTORY": ""})
    assert proc.returncode != 0
    line = one_error_line(proc)
    assert "copy inventory.example.yaml to inventory.yaml" in line, line
