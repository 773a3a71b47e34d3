"""What the relay says when it refuses: the right line, naming the host and the thing.

Over real loopback sshd hosts and the real CLI: a changed host key gets the same line on
the relay's OpenSSH path as on the paramiko one (never the advice to accept new keys),
an unknown one the advice; a known_hosts path OpenSSH's options cannot carry is refused
naming the setting and host; an entry whose name holds a line break is called what it
is, and a checkpoint so named is listed as refused, never silently missing.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers.checkpoints import make_checkpoint, published
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry

KiB = 1024


def _inventory(tenv, known: dict[str, str]) -> str:
    """An inventory for the test's folders whose hosts trust the known_hosts files in
    `known` (host name -> path; the shared file otherwise)."""
    roles = {
        "trainer": {"trainer": {"checkpoints": str(tenv.ckpt)}},
        "evalhost": {"eval": {"drafters": str(tenv.dst)}},
    }
    hosts = {
        name: ssh_host_entry(server, tenv.ssh_base, roles=roles[name])
        for name, server in (("trainer", tenv.trainer), ("evalhost", tenv.evalh))
    }
    for name, path in known.items():
        hosts[name]["known_hosts"] = path
    path = tenv.tmp / "inventory-keys.yaml"
    path.write_text(
        yaml.safe_dump(
            {"hosts": hosts, "defaults": {"relay_from": "trainer", "relay_to": "evalhost"}}
        )
    )
    return str(path)


def _known_hosts(tenv, host: str, key_of) -> str:
    """A known_hosts file listing both hosts, `host` under the key of server `key_of`."""
    lines = []
    for name, server in (("trainer", tenv.trainer), ("evalhost", tenv.evalh)):
        address, rest = server.known_hosts_line().split(" ", 1)
        if name == host:
            rest = key_of.known_hosts_line().split(" ", 1)[1]
        lines.append(f"{address} {rest}")
    path = tenv.tmp / f"known_hosts-{host}"
    path.write_text("".join(lines))
    return str(path)


@pytest.mark.parametrize("host", ["trainer", "evalhost"])
@pytest.mark.parametrize("opt_in", [False, True])
def test_a_changed_host_key_is_named_on_the_relay_path_as_on_paramikos(tenv, host, opt_in):
    """Before: 'Host key verification failed.; an unknown host key is refused: ... rerun
    with --accept-new-host-keys' on the relay's path, with the option given or not."""
    other = tenv.evalh if host == "trainer" else tenv.trainer
    known = _known_hosts(tenv, host, key_of=other)
    inv = _inventory(tenv, {"trainer": known, "evalhost": known})
    make_checkpoint(tenv.ckpt, "step_1", {"w.bin": KiB})
    flag = ["--accept-new-host-keys"] if opt_in else []
    proc = dflash(*flag, "relay", "--inventory", inv)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"{host} (" in line and "host key CHANGED (got SHA256:" in line, line
    assert "accept-new-host-keys" not in line and known in line  # where the old key is
    # the paramiko path says the same, up to where the old key is recorded
    check = dflash(*flag, "hosts", "check", host, "--inventory", inv)
    assert one_error_line(check).split("; refusing")[0] == line.split("; refusing")[0]
    assert published(tenv.dst) == []


def test_an_unknown_host_key_on_the_relay_path_gets_the_opt_in_advice(tenv):
    known = tenv.tmp / "known_hosts-eval-only"
    known.write_text(tenv.evalh.known_hosts_line())
    inv = _inventory(tenv, {"trainer": str(known), "evalhost": str(known)})
    make_checkpoint(tenv.ckpt, "step_1", {"w.bin": KiB})
    proc = dflash("relay", "--inventory", inv)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith("error: trainer (") and "unknown host key, refusing" in line, line
    assert "--accept-new-host-keys" in line and "CHANGED" not in line


def test_a_host_name_that_does_not_resolve_is_one_line_on_the_relay_path_too(tenv):
    """Issue 48.14: `relay` said only ssh's 'Could not resolve hostname evalbx', where
    `hosts check` says what to fix; now both say the same line."""
    inv = _inventory(tenv, {})
    doc = yaml.safe_load(open(inv).read())
    doc["hosts"]["evalhost"]["hostname"] = "evalbx.invalid"  # RFC 2606: never resolves
    with open(inv, "w") as fh:
        yaml.safe_dump(doc, fh)
    make_checkpoint(tenv.ckpt, "step_1", {"w.bin": KiB})
    proc = dflash("relay", "--inventory", inv)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line == (
        "error: evalhost: host name 'evalbx.invalid' does not resolve; fix 'hostname' in "
        "the inventory or your ~/.ssh/config"
    ), line
    assert one_error_line(dflash("hosts", "check", "evalhost", "--inventory", inv)) == line
    assert published(tenv.dst) == []


def test_a_quote_in_a_known_hosts_path_is_refused_naming_the_setting_and_host(tenv):
    """Before: 'trainer: cannot connect over ssh: command-line line 0: invalid quotes'."""
    folder = tenv.tmp / 'keys "quoted"'
    folder.mkdir()
    known = folder / "known_hosts"
    known.write_text((tenv.ssh_base / "known_hosts").read_text())
    inv = _inventory(tenv, {"evalhost": str(known)})
    make_checkpoint(tenv.ckpt, "step_1", {"w.bin": KiB})
    for args in (["relay"], ["hosts", "check", "evalhost"]):  # one resolution, both stacks
        proc = dflash(*args, "--inventory", inv)
        assert proc.returncode != 0
        line = one_error_line(proc)
        assert "evalhost: the inventory's known_hosts" in line and "'\"'" in line, line
    assert published(tenv.dst) == []


def test_a_file_with_a_line_break_in_its_name_is_not_called_a_symlink(tenv):
    """Before: 'the symlink step_3/bad\\nname.bin has a line break in its name'."""
    make_checkpoint(tenv.ckpt, "step_3", {"w.bin": KiB})
    (tenv.ckpt / "step_3" / "bad\nname.bin").write_bytes(b"y")
    proc = tenv.cli("step_3")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "step_3/bad\\nname.bin has a line break in its name; rename it" in line, line
    assert "symlink" not in line
    assert published(tenv.dst) == []


def test_a_checkpoint_with_a_line_break_in_its_name_is_listed_refused(tenv):
    """Before: missing from --list, --all and their JSON, as if it were not there."""
    make_checkpoint(tenv.ckpt, "step_1", {"w.bin": KiB})
    make_checkpoint(tenv.ckpt, "step_2\nx", {"w.bin": KiB})
    why = "its name has a line break; rename it"
    listing = tenv.cli("--list")
    assert listing.returncode == 0, listing.stderr
    rows = {r["name"]: r for r in json.loads(listing.stdout)["checkpoints"]}
    assert set(rows) == {"step_1", "step_2\\nx"}
    assert rows["step_2\\nx"]["complete"] is False and rows["step_2\\nx"]["reason"] == why
    human = dflash("relay", "--list", "--inventory", str(tenv.inventory_path))
    assert "step_2\\nx" in human.stdout and "line break" in human.stdout

    every = tenv.cli("--all")
    assert every.returncode == 0, every.stderr
    report = json.loads(every.stdout)
    assert [c["name"] for c in report["checkpoints"]] == ["step_1"]
    assert report["incomplete"] == [
        {"name": "step_2\\nx", "step": 2, "reason": why, "named": False}
    ]
    for ask in (["--step", "2"], ["step_2\\nx"]):  # asked for: not relayed, and exit 1
        asked = tenv.cli(*ask)
        assert asked.returncode == 1 and why in one_error_line(asked), asked.stderr
    assert published(tenv.dst) == ["step_1"]
