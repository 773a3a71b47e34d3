"""The host layer and `dflash hosts` over real loopback sshd servers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import hoist
from orchestrator.inventory import load_inventory
from orchestrator.transport import bundle
from orchestrator.transport.hosts import HostError, open_host
from tests.helpers.cli import ROOT, dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry, start_sshd


def test_hosts_check_reports_facts_for_both_hosts(two_hosts):
    proc = dflash("hosts", "check", "trainer", "evalhost", "--inventory", str(two_hosts), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["host"] for r in rows] == ["trainer", "evalhost"]
    for r in rows:
        assert r["reachable"] is True
        assert r["cpus"] == os.cpu_count()
        assert r["memory"]["total"] > r["memory"]["available"] > 0
        assert r["disk_free"] > 0
        assert r["python"] == ".".join(map(str, sys.version_info[:3]))
        assert r["packages"]["torch"].startswith("2.")
        assert r["packages"]["fla"] is None  # not installed here: reported missing
    table = dflash("hosts", "check", "--inventory", str(two_hosts), env={"COLUMNS": "100"})
    assert table.returncode == 0
    assert "trainer" in table.stdout and "evalhost" in table.stdout and "yes" in table.stdout
    # Fits 100 columns without cutting a value: full versions, fla reported missing.
    assert max(len(line) for line in table.stdout.splitlines()) <= 100
    assert f"torch {rows[0]['packages']['torch']}" in table.stdout
    assert "fla - *" in table.stdout and "…" not in table.stdout


def test_hosts_check_shows_what_each_role_needs(
    trainer_sshd, eval_sshd, ssh_base, make_inventory, tmp_path
):
    """Issue 48.11: a trainer whose python had no torch showed `torch missing` three times,
    though its relay needs python3's standard library only, and `fla missing` was never
    explained. Now a package no role needs is `-`, fla is marked optional and explained
    under the table, and an eval host whose python lacks torch is one line saying what
    to set (exit 1)."""
    bare = tmp_path / "bare-python"  # a real python without site-packages: no torch
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    roles = {"trainer": {"checkpoints": str(tmp_path)}, "eval": {"drafters": str(tmp_path)}}
    inv = make_inventory(
        hosts={
            name: ssh_host_entry(server, ssh_base, python=str(bare), roles={role: roles[role]})
            for name, server, role in (
                ("trainer", trainer_sshd, "trainer"),
                ("evalbox", eval_sshd, "eval"),
            )
        }
    )
    trainer = dflash("hosts", "check", "trainer", "-i", str(inv), env={"COLUMNS": "100"})
    assert trainer.returncode == 0 and trainer.stderr == "", trainer.stderr
    assert "torch -" in trainer.stdout and "fla - *" in trainer.stdout
    assert "missing" not in trainer.stdout
    prose = " ".join(trainer.stdout.split())
    assert "a trainer's relay needs python3's standard library only" in prose
    assert "fla (flash-linear-attention): linear-attention kernels; without them" in prose
    assert max(len(line) for line in trainer.stdout.splitlines()) <= 100
    evalbox = dflash("hosts", "check", "evalbox", "-i", str(inv), "--json")
    assert evalbox.returncode == 1
    assert one_error_line(evalbox) == (
        "error: evalbox: the eval role needs torch, transformers, safetensors, missing from "
        f"{sys.executable}; set 'python:' for evalbox in the inventory to a python that has them"
    )
    [row] = json.loads(evalbox.stdout)
    assert row["roles"] == ["eval"] and row["packages_missing"] == row["packages_needed"]
    assert row["packages_needed"] == ["torch", "transformers", "safetensors"]


def test_a_local_host_without_python_runs_dflash_s_own_whatever_path_says(make_inventory, tmp_path):
    """The demo's bug on a fresh machine: its local hosts ran PATH's ``python3`` (Debian's,
    without torch) instead of the venv's python that runs dflash. With the clean PATH a
    fresh machine has, the host still reports dflash's own interpreter and its torch."""
    inv = make_inventory(hosts={"here": {"transport": "local", "workdir": str(tmp_path / "w")}})
    clean_path = "/usr/sbin:/usr/bin:/sbin:/bin"
    proc = dflash("hosts", "check", "-i", str(inv), "--json", env={"PATH": clean_path})
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    assert row["python_executable"] == sys.executable
    assert row["packages"]["torch"]


def test_hosts_lists_inventory(two_hosts):
    proc = dflash("hosts", "--inventory", str(two_hosts), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {h["name"]: h["roles"] for h in data["hosts"]} == {
        "trainer": ["trainer"],
        "evalhost": ["eval"],
    }


def test_unknown_host_key_is_refused_then_accepted_on_opt_in(
    trainer_sshd, ssh_base, make_inventory, tmp_path
):
    empty_known = tmp_path / "known_hosts"
    empty_known.write_text("")
    inv = make_inventory(
        {"t": ssh_host_entry(trainer_sshd, ssh_base, known_hosts=str(empty_known))}
    )
    proc = dflash("hosts", "check", "t", "--inventory", str(inv))
    assert proc.returncode != 0
    line = one_error_line(proc)
    assert "unknown host key" in line and "--accept-new-host-keys" in line
    assert empty_known.read_text() == ""

    ok = dflash("--accept-new-host-keys", "hosts", "check", "t", "--inventory", str(inv))
    assert ok.returncode == 0, ok.stderr
    assert f"[127.0.0.1]:{trainer_sshd.port}" in empty_known.read_text()
    # Now known: accepted without the flag.
    assert dflash("hosts", "check", "t", "--inventory", str(inv)).returncode == 0


def test_accept_new_host_keys_works_after_the_command_too(
    trainer_sshd, ssh_base, make_inventory, tmp_path
):
    """Issue 48.7: told to "rerun with --accept-new-host-keys", a user appends it to the
    command; that was `No such option`. The root's flag is taken where it is given, by
    commands and by a group's subcommands alike."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = make_inventory({"t": ssh_host_entry(trainer_sshd, ssh_base, known_hosts=str(known))})
    refused = dflash("jobs", "list", "-H", "t", "-i", str(inv))
    assert "rerun with --accept-new-host-keys" in one_error_line(refused)
    ok = dflash("jobs", "list", "-H", "t", "-i", str(inv), "--json", "--accept-new-host-keys")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == [] and f"[127.0.0.1]:{trainer_sshd.port}" in known.read_text()
    known.write_text("")
    ok = dflash("hosts", "check", "t", "--accept-new-host-keys", "-i", str(inv), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["reachable"] is True and known.read_text()
    # after `--`, a word is an argument, never the root's flag
    assert hoist(["relay", "--", "--accept-new-host-keys"], {"--accept-new-host-keys"}) == [
        "relay",
        "--",
        "--accept-new-host-keys",
    ]


def test_changed_host_key_is_always_refused(
    trainer_sshd, eval_sshd, ssh_base, make_inventory, tmp_path
):
    # Record the EVAL host's key under the trainer's address: the trainer now "changed" key.
    wrong = tmp_path / "known_hosts"
    line = eval_sshd.known_hosts_line().split(" ", 1)[1]
    wrong.write_text(f"[127.0.0.1]:{trainer_sshd.port} {line}")
    inv = make_inventory(
        {
            "t": ssh_host_entry(
                trainer_sshd, ssh_base, known_hosts=str(wrong), accept_new_host_key=True
            )
        }
    )
    proc = dflash("--accept-new-host-keys", "hosts", "check", "t", "--inventory", str(inv))
    assert proc.returncode != 0
    assert "host key CHANGED" in one_error_line(proc)


def test_closed_port_bad_key_and_missing_python_are_one_line_each(
    trainer_sshd, ssh_base, make_inventory, tmp_path
):
    from tests.helpers.sshd import free_port, keygen

    stranger = keygen(tmp_path / "id_stranger")
    inv = make_inventory(
        {
            "closed": {**ssh_host_entry(trainer_sshd, ssh_base), "port": free_port()},
            "badkey": ssh_host_entry(trainer_sshd, ssh_base, identity_file=str(stranger)),
            "nopython": ssh_host_entry(trainer_sshd, ssh_base, python="/no/such/python3"),
        }
    )
    expected = {
        "closed": "connection refused",
        "badkey": "authentication failed",
        "nopython": "not found",
    }
    for name, words in expected.items():
        proc = dflash("hosts", "check", name, "--inventory", str(inv))
        assert proc.returncode != 0
        line = one_error_line(proc)
        assert words in line and name in line, line


def test_arguments_are_shell_quoted_on_ssh_and_local(two_hosts, tmp_path):
    inv = load_inventory(two_hosts)
    marker = tmp_path / "pwned"
    nasty = f"a b;touch {marker};$(touch {marker}) `touch {marker}` 'q\" -x"
    local = open_host(inv.hosts["trainer"].__class__(name="l", transport="local"))
    for host in (open_host(inv.hosts["trainer"]), local):
        with host:
            out = host.run(["printf", "%s", nasty]).stdout
            assert out == nasty
            path = f"{tmp_path}/-dash {host.name} $(x);'.bin"
            host.put_bytes(b"\x00\x01payload", path)
            assert host.get_bytes(path) == b"\x00\x01payload"
            assert Path(path).read_bytes() == b"\x00\x01payload"
    assert not marker.exists()


def test_bundle_is_pushed_once_and_named_by_content(two_hosts):
    inv = load_inventory(two_hosts)
    with open_host(inv.hosts["evalhost"]) as host:
        host.run(["rm", "-rf", f"{host.workdir}/bundles"])
        path, pushed = bundle.ensure(host)
        assert pushed and host.exists(path)
        assert bundle.ensure(host) == (path, False)  # this connection remembers the push
    with open_host(inv.hosts["evalhost"]) as again:  # a new one re-checks: file there, no push
        assert bundle.ensure(again) == (path, False)
    name, data = bundle.build()
    assert Path(path).name == name and Path(path).read_bytes() == data


def test_remote_user_error_is_relayed_as_one_line(two_hosts):
    inv = load_inventory(two_hosts)
    with open_host(inv.hosts["evalhost"]) as host:
        with pytest.raises(HostError) as info:
            host.run(["false"])
        assert "exit 1" in str(info.value)


def test_help_works_without_torch():
    """The controller must start where torch and transformers are not installed."""
    blocker = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers', 'safetensors'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.argv = ['dflash', '--help']\n"
        "from orchestrator.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "from orchestrator.cli import app\n"
        "import typer.main\n"
        "cmd = typer.main.get_command(app)\n"
        "names = sorted(cmd.commands)\n"
        "for n in names:\n"
        "    sys.argv = ['dflash', n, '--help']\n"
        "    try:\n        main()\n    except SystemExit as "
        "e:\n        assert e.code in (0, None), (n, e.code)\n"
        "assert 'torch' not in sys.modules\n"
        "print('COMMANDS', ' '.join(names))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocker],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "COMMANDS" in proc.stdout and "hosts" in proc.stdout


def test_unresolvable_name_and_silent_port_are_one_line_each(
    ssh_base, trainer_sshd, make_inventory
):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts TCP, never says a word
    try:
        inv = make_inventory(
            {
                "nowhere": ssh_host_entry(trainer_sshd, ssh_base, hostname="no-such-host.invalid"),
                "silent": {
                    **ssh_host_entry(trainer_sshd, ssh_base),
                    "connect_timeout": 1,
                    "port": silent.getsockname()[1],
                },
            }
        )
        for name, words in {"nowhere": "does not resolve", "silent": "timed out"}.items():
            proc = dflash("hosts", "check", name, "--inventory", str(inv))
            assert proc.returncode != 0
            assert words in one_error_line(proc)
    finally:
        silent.close()


def test_jump_host_reaches_eval_host_through_trainer(
    trainer_sshd, eval_sshd, ssh_base, make_inventory
):
    inv = make_inventory(
        {
            "trainer": ssh_host_entry(trainer_sshd, ssh_base),
            "behind": ssh_host_entry(eval_sshd, ssh_base, jump="trainer"),
        }
    )
    before = len(trainer_sshd.sessions())
    with open_host(load_inventory(inv).hosts["behind"], load_inventory(inv)) as host:
        assert host.run(["printf", "%s", "hello"]).stdout == "hello"
        # The tunnel runs through a session on the trainer's sshd.
        assert len(trainer_sshd.sessions()) > before


def test_ssh_config_alias_is_honoured(eval_sshd, ssh_base, make_inventory, tmp_path, monkeypatch):
    """A host named only by an ~/.ssh/config alias resolves as OpenSSH would."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host ct-alias\n  HostName 127.0.0.1\n  Port {eval_sshd.port}\n"
        f"  IdentityFile {ssh_base / 'id_test'}\n"
        f"  UserKnownHostsFile {ssh_base / 'known_hosts'}\n"
    )
    inv = make_inventory({"ct-alias": {"python": sys.executable}})
    proc = dflash(
        "hosts", "check", "ct-alias", "--inventory", str(inv), "--json", env={"HOME": str(home)}
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["reachable"] is True


def test_bundle_modules_carry_bytecode_that_another_python_ignores(tmp_path):
    """Each module of the bundle has its bytecode beside it (no compile at every host-side
    start); a python of another version (another magic number) compiles the source."""
    import zipfile

    from orchestrator.transport.bundle import _pyc

    _, data = bundle.build()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "remote/relay/send.pyc" in names and "remote/cli.pyc" in names
    for magic_ok, expected in ((True, "bytecode"), (False, "source")):
        pyc = bytearray(_pyc("m.py", b'X = "bytecode"\n'))
        if not magic_ok:
            pyc[0] ^= 0xFF
        archive = tmp_path / f"{expected}.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("m.py", 'X = "source"\n')  # differs from the bytecode on purpose
            zf.writestr("m.pyc", bytes(pyc))
        out = subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                f"import sys; sys.path[:0] = [{str(archive)!r}]; import m; print(m.X)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == expected


def test_a_host_home_that_is_no_absolute_path_is_refused(ssh_base, make_inventory):
    """A host's $HOME becomes part of the paths dflash sends back to it (a ``~`` workdir):
    one that is not absolute is refused with one line naming the host, not used."""
    server = start_sshd(ssh_base, "oddhome", ("SetEnv HOME=relative/home",))
    try:
        inv = make_inventory(hosts={"oddhome": ssh_host_entry(server, ssh_base, workdir="~/w")})
        with open_host(load_inventory(inv).hosts["oddhome"]) as host:
            assert host.run('printf %s "$HOME"').stdout == "relative/home"  # really sent
            with pytest.raises(HostError, match=r"oddhome: its \$HOME is not an absolute path"):
                host.expand("~/w")
    finally:
        server.stop()
