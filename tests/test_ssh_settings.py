"""One ssh_config resolution for both SSH stacks, against real loopback sshd servers.

The user's ``~/.ssh/config`` here lives in a temporary ``$HOME`` and defines its hosts only
in an INCLUDED file, with the key in a ``Match host`` block, the host keys only in a
GlobalKnownHostsFile, a ProxyJump to another included alias, and a host reached only through
an ssh-agent named by IdentityAgent. Every command's stack must reach them: `dflash hosts
check` and the host layer (paramiko, as probe and eval use it) and the relay (OpenSSH).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.inventory import load_inventory
from orchestrator.transport import ssh_config, ssh_settings
from orchestrator.transport.hosts import HostError, open_host
from orchestrator.transport.openssh_host import stream_argv
from tests.helpers.cli import dflash
from tests.helpers.sshd import keygen, ssh_host_entry


@pytest.fixture
def ssh_home(tmp_path, ssh_base, trainer_sshd, eval_sshd, monkeypatch):
    """A $HOME whose ~/.ssh/config includes the file that defines every alias."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    user = os.environ.get("USER") or "root"
    (home / ".ssh" / "config").write_text(f"Include {conf_d}/*.conf\n")
    (conf_d / "hosts.conf").write_text(f"""
Host trainer-inc
  HostName 127.0.0.1
  Port {trainer_sshd.port}
Host ct-inc
  HostName 127.0.0.1
  Port {eval_sshd.port}
Host behind-inc
  HostName localhost
  Port {eval_sshd.port}
  ProxyJump trainer-inc
Host *-inc
  User {user}
  UserKnownHostsFile {tmp_path / "user_known_hosts"}
  GlobalKnownHostsFile {ssh_base / "known_hosts"}
  IdentitiesOnly yes
Match host 127.0.0.1,localhost
  IdentityFile {ssh_base / "id_test"}
""")
    # The eval host's key under the name 'localhost' too, for the host behind the jump.
    line = eval_sshd.known_hosts_line().replace("[127.0.0.1]", "[localhost]")
    with open(ssh_base / "known_hosts", "a") as fh:
        fh.write(line)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def test_resolution_follows_include_match_and_known_hosts_files(
    ssh_home, ssh_base, make_inventory, tmp_path
):
    inv = load_inventory(make_inventory({"ct-inc": {"python": sys.executable}}))
    s = ssh_settings.resolve(inv.hosts["ct-inc"], inv)
    assert (s.alias, s.hostname) == ("ct-inc", "127.0.0.1")
    assert s.identity_files == (str(ssh_base / "id_test"),)  # from the Match block
    assert s.identities_only is True and s.identity_agent is None
    assert s.user_known_hosts[0] == str(tmp_path / "user_known_hosts")
    assert str(ssh_base / "known_hosts") in s.global_known_hosts
    assert s.config_file == str(ssh_home / ".ssh" / "config")
    # The inventory overrides ssh_config, as ssh's command line does.
    inv = load_inventory(make_inventory({"ct-inc": {"port": 1, "user": "someone"}}))
    s = ssh_settings.resolve(inv.hosts["ct-inc"], inv)
    assert (s.port, s.user) == (1, "someone")
    behind = ssh_settings.resolve(
        load_inventory(make_inventory({"behind-inc": {}})).hosts["behind-inc"]
    )
    assert behind.jump is not None and behind.jump.alias == "trainer-inc"
    assert behind.jump.hostname == "127.0.0.1"


def test_included_aliases_work_for_hosts_check_probe_connection_and_relay(
    ssh_home, trainer_sshd, eval_sshd, make_inventory
):
    ckpt = trainer_sshd.root / f"inc-ckpt-{time.monotonic_ns()}"
    (ckpt / "step_7").mkdir(parents=True)
    payload = os.urandom(3 << 20)
    (ckpt / "step_7" / "model.safetensors").write_bytes(payload)
    (ckpt / "step_7" / "COMPLETE").write_text("")
    drafters = eval_sshd.root / f"inc-drafters-{time.monotonic_ns()}"
    drafters.mkdir()
    path = make_inventory(
        {
            "trainer-inc": {
                "python": sys.executable,
                "roles": {"trainer": {"checkpoints": str(ckpt)}},
            },
            "behind-inc": {
                "python": sys.executable,
                "roles": {"eval": {"drafters": str(drafters)}},
            },
        },
        defaults={"relay_from": "trainer-inc", "relay_to": "behind-inc"},
    )
    env = {"HOME": str(ssh_home)}

    check = dflash("hosts", "check", "--inventory", str(path), "--json", env=env)
    assert check.returncode == 0, check.stderr
    assert [r["reachable"] for r in json.loads(check.stdout)] == [True, True]

    inv = load_inventory(path)
    before = len(trainer_sshd.sessions())
    with open_host(inv.hosts["behind-inc"], inv) as host:  # the connection probe/eval use
        assert host.run(["printf", "%s", "paramiko"]).stdout == "paramiko"
        assert len(trainer_sshd.sessions()) > before  # through the jump host

    relayed = dflash("relay", "--inventory", str(path), "--json", env=env)
    assert relayed.returncode == 0, relayed.stderr
    got = (drafters / "step_7" / "model.safetensors").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


def test_unknown_host_keys_stay_refused_through_ssh_config(
    ssh_home, ssh_base, make_inventory, tmp_path
):
    conf = tmp_path / "conf.d" / "hosts.conf"
    conf.write_text(
        conf.read_text().replace(
            f"GlobalKnownHostsFile {ssh_base / 'known_hosts'}", "GlobalKnownHostsFile /dev/null"
        )
    )
    inv = load_inventory(make_inventory({"ct-inc": {"python": sys.executable}}))
    with pytest.raises(HostError, match="unknown host key"):
        open_host(inv.hosts["ct-inc"], inv).run(["true"])
    proc = subprocess.run(
        stream_argv(open_host(inv.hosts["ct-inc"], inv), "true", inv),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr
    assert not (tmp_path / "user_known_hosts").exists()  # nothing remembered


def test_identity_agent_from_ssh_config_serves_both_stacks(
    ssh_home, ssh_base, make_inventory, tmp_path, eval_sshd
):
    """A host whose only key is in an agent that ssh_config names (IdentityAgent), while
    $SSH_AUTH_SOCK is unset and no key file is configured."""
    sock = tmp_path / "agent.sock"
    authorized = Path(ssh_base / "authorized_keys")
    original = authorized.read_text()
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        # A copy of the test key lives only in the agent; its file is gone.
        key = keygen(tmp_path / "agent_only")
        authorized.write_text(original + key.with_suffix(".pub").read_text())
        subprocess.run(
            ["ssh-add", "-q", str(key)], check=True, env={**os.environ, "SSH_AUTH_SOCK": str(sock)}
        )
        key.unlink()
        key.with_suffix(".pub").unlink()
        (ssh_home / ".ssh" / "config").write_text(
            f"Host agent-ct\n  HostName 127.0.0.1\n  Port {eval_sshd.port}\n"
            f"  IdentityAgent {sock}\n  IdentityFile /nonexistent/key\n"
            f"  UserKnownHostsFile {ssh_base / 'known_hosts'}\n"
        )
        inv = load_inventory(make_inventory({"agent-ct": {"python": sys.executable}}))
        settings = ssh_settings.resolve(inv.hosts["agent-ct"], inv)
        assert settings.identity_agent == str(sock) and settings.identity_files == ()
        with open_host(inv.hosts["agent-ct"], inv) as host:
            assert host.run(["printf", "%s", "agent"]).stdout == "agent"
            proc = subprocess.run(
                stream_argv(host, "printf %s openssh", inv),
                capture_output=True,
                text=True,
                timeout=30,
            )
        assert proc.returncode == 0 and proc.stdout == "openssh", proc.stderr
    finally:
        authorized.write_text(original)
        agent.terminate()
        agent.wait(timeout=10)


def test_without_an_ssh_client_paramiko_reads_the_same_file(
    ssh_home, ssh_base, eval_sshd, make_inventory, monkeypatch
):
    """No `ssh` binary (a controller-only laptop): the same settings from paramiko's parser
    (which has no Include, so the alias sits in the config itself)."""
    (ssh_home / ".ssh" / "config").write_text(
        f"Host plain-ct\n  HostName 127.0.0.1\n  Port {eval_sshd.port}\n"
        f"  IdentityFile {ssh_base / 'id_test'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {ssh_base / 'known_hosts'}\n"
    )
    inv = load_inventory(make_inventory({"plain-ct": {"python": sys.executable}}))
    with_ssh = ssh_settings.resolve(inv.hosts["plain-ct"], inv)
    monkeypatch.setattr(ssh_config.shutil, "which", lambda name: None)
    without = ssh_settings.resolve(inv.hosts["plain-ct"], inv)
    for field in ("hostname", "port", "identity_files", "identities_only"):
        assert getattr(without, field) == getattr(with_ssh, field), field
    assert without.user_known_hosts[0] == str(ssh_base / "known_hosts")
    with open_host(inv.hosts["plain-ct"], inv) as host:
        assert host.run(["printf", "%s", "ok"]).stdout == "ok"


@pytest.mark.parametrize(
    "lines, expected",
    [
        ("ControlMaster auto\n  ControlPersist 10m", "600"),
        ("ControlMaster autoask\n  ControlPersist yes", "yes"),
        ("ControlMaster auto\n  ControlPersist no", None),  # the master ends with a session
        ("ControlMaster yes\n  ControlPersist 10m", None),  # not 'auto': every ssh a master
        ("ControlMaster no\n  ControlPersist 10m", None),
    ],
)
def test_a_persisted_shared_master_is_read_from_ssh_config(
    ssh_home, make_inventory, tmp_path, lines, expected
):
    """Only ControlMaster auto/autoask with a ControlPersist asks for a master the relay
    may share; its path is the one `ssh -G` expands for this very host."""
    with open(ssh_home / ".ssh" / "config", "a") as fh:
        fh.write(f"Host ct-inc\n  {lines}\n  ControlPath {tmp_path}/cm-%r@%h:%p\n")
    s = ssh_settings.resolve(load_inventory(make_inventory({"ct-inc": {}})).hosts["ct-inc"])
    user = os.environ.get("USER") or "root"
    if expected is None:
        assert s.shared_master is None
    else:
        assert s.shared_master == (f"{tmp_path}/cm-{user}@127.0.0.1:{s.port}", expected)


@pytest.mark.parametrize(
    ("written", "found"),
    [(r'"/tmp/keys \"q\"/known_hosts"', "'\"'"), (r'"/tmp/keys\\\\x/known_hosts"', "backslash")],
)
def test_a_known_hosts_file_ssh_cannot_be_handed_is_refused_naming_the_setting(
    ssh_home, make_inventory, written, found
):
    """ssh_config's UserKnownHostsFile with a '"' (or an escaping backslash) parses, but
    cannot be given back to ssh in quotes: refused at resolution, for both stacks, naming
    the setting and host. Before: the relay's ssh said 'command-line line 0: invalid
    quotes' (or read another file)."""
    conf = ssh_home / ".ssh" / "config"
    conf.write_text(f"Host odd-kh\n  HostName 127.0.0.1\n  UserKnownHostsFile {written}\n")
    inv = load_inventory(make_inventory({"odd": {"hostname": "odd-kh"}}))
    with pytest.raises(ssh_settings.SSHConfigError) as caught:
        ssh_settings.resolve(inv.hosts["odd"], inv)
    line = str(caught.value)
    assert line.startswith("odd: ssh_config's UserKnownHostsFile") and found in line, line
    assert "\n" not in line


def test_a_dead_peer_ends_paramikos_connection_within_its_keepalives(
    trainer_sshd, ssh_base, make_inventory
):
    """paramiko sent a keepalive every 30 s and waited on an unanswering host for as long
    as TCP retransmits (a quarter of an hour or more); OpenSSH's streams give up after
    ServerAliveInterval x ServerAliveCountMax. Both now: unacknowledged that long, the
    kernel ends the connection, and every read on it."""
    import socket

    inv = load_inventory(make_inventory({"t": ssh_host_entry(trainer_sshd, ssh_base)}))
    limit = ssh_settings.ALIVE_INTERVAL * ssh_settings.ALIVE_COUNT
    with open_host(inv.hosts["t"], inv) as host:
        assert host.run(["true"]).ok
        sock = host.transport.sock
        got = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        assert got == limit * 1000
        options = " ".join(host.settings.openssh_options())
    assert f"ServerAliveInterval={ssh_settings.ALIVE_INTERVAL}" in options
    assert f"ServerAliveCountMax={ssh_settings.ALIVE_COUNT}" in options
