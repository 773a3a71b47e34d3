"""The relay's ssh masters: the user's persisted master when ssh_config asks for one, else a
private master that ends with the relay. Real sshd hosts on loopback, real OpenSSH clients.

A persisted master is proven used, not just present: the second relay runs with an identity
file that does not exist, so any fresh login it tried would be refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from orchestrator.inventory import load_inventory
from orchestrator.relay.run import RelayOptions, relay
from orchestrator.transport.hosts import open_host
from tests.helpers.checkpoints import make_checkpoint, tree
from tests.helpers.sshd import account_home, ssh_host_entry

KiB = 1024


def _home(tmp_path: Path, monkeypatch, config: str) -> Path:
    """A $HOME whose ~/.ssh/config is `config` (ssh then reads it: see ssh_settings)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(config)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # no agent: the key file is all
    return home


def _inventory(tenv, make_inventory, key: str | None = None) -> Path:
    extra = {"identity_file": key} if key else {}
    return make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                tenv.trainer,
                tenv.ssh_base,
                roles={"trainer": {"checkpoints": str(tenv.ckpt)}},
                **extra,
            ),
            "evalhost": ssh_host_entry(
                tenv.evalh, tenv.ssh_base, roles={"eval": {"drafters": str(tenv.dst)}}, **extra
            ),
        },
        defaults={"relay_from": "trainer", "relay_to": "evalhost"},
    )


def _relay(inv: Path, name: str):
    return relay(load_inventory(inv), "trainer", ["evalhost"], RelayOptions(names=[name]))


def _exit_masters(sockets: list[Path]) -> None:
    for sock in sockets:
        subprocess.run(
            ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
            capture_output=True,
            timeout=10,
        )


def _our_masters() -> list[psutil.Process]:
    """ssh masters (``-N``) that this test process started and that still run."""
    me = os.getpid()
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[:1] == ["ssh"] and "-N" in cmd and f"dfr-{me}-" in " ".join(cmd):
            out.append(p)
    return out


CONFIG = "Host *\n  ControlMaster auto\n  ControlPath {cm}/%C\n  ControlPersist 60\n"


@pytest.fixture
def cm():
    """A short private folder for the sockets (a socket's path is at most ~104 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_configured_persisted_master_serves_the_next_relay_without_a_login(
    tenv, make_inventory, tmp_path, monkeypatch, cm
):
    _home(tmp_path, monkeypatch, CONFIG.format(cm=cm))
    files = make_checkpoint(tenv.ckpt, "step_1", {"a.bin": 64 * KiB, "b/c.bin": 3 * KiB})
    inv = _inventory(tenv, make_inventory)
    sockets: list[Path] = []
    try:
        report = _relay(inv, "step_1")
        assert report.ok, report.failures
        assert tree(tenv.dst / "step_1") == files
        sockets = sorted(cm.iterdir())
        assert len(sockets) == 2, sockets  # one persisted master per host, as configured
        # The path is what `ssh -G` expanded for each host: the user's own ssh shares it.
        spec = load_inventory(inv).host("evalhost")
        assert Path(open_host(spec).settings.shared_master[0]) in sockets
        assert not _our_masters()  # no private master, nothing of ours left running

        # Same hosts, a key that does not exist: only the persisted masters can serve.
        make_checkpoint(tenv.ckpt, "step_2", {"a.bin": 32 * KiB})
        inv = _inventory(tenv, make_inventory, key=str(tmp_path / "no-such-key"))
        report = _relay(inv, "step_2")
        assert report.ok, report.failures
        assert (tenv.dst / "step_2" / "a.bin").stat().st_size == 32 * KiB
        assert sorted(cm.iterdir()) == sockets
    finally:
        _exit_masters(sockets)


def test_without_such_config_a_fresh_login_is_needed_and_nothing_is_left(
    tenv, make_inventory, tmp_path, monkeypatch
):
    """The control for the test above: the same missing key fails without a master, and
    the private masters end with each relay."""
    _home(tmp_path, monkeypatch, "Host *\n  ControlMaster no\n")
    files = make_checkpoint(tenv.ckpt, "step_1", {"a.bin": 16 * KiB})
    report = _relay(_inventory(tenv, make_inventory), "step_1")
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_1") == files
    assert not _our_masters()
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"dfr-{os.getpid()}-*"))
    make_checkpoint(tenv.ckpt, "step_2", {"a.bin": 16 * KiB})
    inv = _inventory(tenv, make_inventory, key=str(tmp_path / "no-such-key"))
    with pytest.raises(Exception, match="cannot connect over ssh"):
        _relay(inv, "step_2")
    assert not (tenv.dst / "step_2").exists()


def test_one_configured_path_for_two_hosts_is_not_shared_between_them(
    tenv, make_inventory, tmp_path, monkeypatch, cm
):
    """A ControlPath without %C (or %h/%p/%r) names one socket for every host: a master
    for the trainer would then carry the eval host's commands. Each gets a private one."""
    _home(
        tmp_path,
        monkeypatch,
        f"Host *\n  ControlMaster auto\n  ControlPath {cm}/one\n  ControlPersist 60\n",
    )
    files = make_checkpoint(tenv.ckpt, "step_1", {"a.bin": 16 * KiB})
    try:
        report = _relay(_inventory(tenv, make_inventory), "step_1")
        assert report.ok, report.failures
        assert tree(tenv.dst / "step_1") == files
        assert not (cm / "one").exists()
        assert not _our_masters()
    finally:
        _exit_masters([cm / "one"])


@pytest.mark.parametrize("where", ["missing folder", "path too long"])
def test_an_unusable_configured_path_falls_back_to_a_private_master(
    tenv, make_inventory, tmp_path, monkeypatch, cm, where
):
    """ssh itself fails a connection whose socket path is too long: the relay does not."""
    folder = cm / "not-there" if where == "missing folder" else cm / ("d" * 80)
    if where != "missing folder":
        folder.mkdir()
    _home(tmp_path, monkeypatch, CONFIG.format(cm=folder))
    files = make_checkpoint(tenv.ckpt, "step_1", {"a.bin": 16 * KiB})
    report = _relay(_inventory(tenv, make_inventory), "step_1")
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_1") == files
    assert not folder.exists() or not any(folder.iterdir())
    assert not _our_masters()


def test_a_home_relative_workdir_costs_no_home_lookup(tenv, make_inventory):
    """The default workdir is ``~/.dflash``: its ``~`` is left to the host's shell, so a
    relay does not ask each host for its home (a whole command) before its first one."""
    from orchestrator.relay.session import Session

    workdir = f"~/.dflash-test-{os.getpid()}-{tenv.dst.name}"
    inv = make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                tenv.trainer,
                tenv.ssh_base,
                workdir=workdir,
                roles={"trainer": {"checkpoints": str(tenv.ckpt)}},
            ),
            "evalhost": ssh_host_entry(
                tenv.evalh,
                tenv.ssh_base,
                workdir=workdir,
                roles={"eval": {"drafters": str(tenv.dst)}},
            ),
        },
        defaults={"relay_from": "trainer", "relay_to": "evalhost"},
    )
    home = account_home()  # the loopback hosts' user is this one
    files = make_checkpoint(tenv.ckpt, "step_1", {"a.bin": 16 * KiB})
    try:
        assert _relay(inv, "step_1").ok  # the first pushes the bundle there
        assert list((home / workdir[2:] / "bundles").glob("dflash-remote-*.pyz"))
        assert tree(tenv.dst / "step_1") == files
        with Session(load_inventory(inv), "trainer", ["evalhost"], RelayOptions()) as s:
            assert "step_1" in s.src_scan.checkpoints
            assert s.src._home is None and s.hosts["evalhost"]._home is None
    finally:
        shutil.rmtree(home / workdir[2:], ignore_errors=True)
