"""Uploads to a host (`Host.put_bytes`, content-addressed reuse) over a real loopback sshd
and the local transport: what arrives is checked before it gets its final name."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.eval.uploads import carry_or_push
from orchestrator.inventory import load_inventory
from orchestrator.transport.hosts import HostError, open_host, upload_line
from tests.helpers.cli import ROOT


def _hosts(inventory: Path):
    inv = load_inventory(inventory)
    local = open_host(inv.hosts["evalhost"].__class__(name="here", transport="local"))
    return [open_host(inv.hosts["evalhost"]), local]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("cut", [0, 1, 1 << 20])
def test_an_upload_cut_short_leaves_nothing_under_any_name(two_hosts, tmp_path, cut):
    """The sender stops `cut` bytes short (its process died: the host's ``cat`` sees an
    end of input and exits 0, which the old upload took for success)."""
    data = os.urandom(3 << 20)
    for host in _hosts(two_hosts):
        with host:
            folder = tmp_path / host.name
            path = str(folder / "abc-prompts.jsonl")
            proc = host.popen(upload_line(path, hashlib.sha256(data).hexdigest(), len(data)))
            proc.write(data[: len(data) - cut] if cut else data[:-1] + b"\0")
            proc.close_stdin()
            assert proc.wait() != 0
            why = proc.stderr()
            assert "bytes arrived" in why if cut else "differs from what was sent" in why
            assert _leftovers(folder) == []


def test_a_whole_upload_gets_its_name_and_mode(two_hosts, tmp_path):
    data = os.urandom(1 << 20)
    for host in _hosts(two_hosts):
        with host:
            path = tmp_path / host.name / "sub" / "x.pyz"
            host.put_bytes(data, str(path), mode=0o600)
            assert path.read_bytes() == data
            assert path.stat().st_mode & 0o777 == 0o600
            assert _leftovers(path.parent) == ["x.pyz"]


def test_an_upload_never_writes_through_a_planted_link(two_hosts, tmp_path):
    """The new file is created (noclobber): a link at its temporary name is refused, the
    file it points to untouched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    for host in _hosts(two_hosts):
        with host:
            folder = tmp_path / host.name
            folder.mkdir()
            path = folder / "f.bin"
            line = upload_line(str(path), hashlib.sha256(b"new").hexdigest(), 3)
            tmp = line.split("; t=")[1].split("; trap")[0].strip("'")
            Path(tmp).symlink_to(victim)
            proc = host.popen(line)
            proc.write(b"new")
            proc.close_stdin()
            assert proc.wait() != 0
            assert victim.read_bytes() == b"keep" and not path.exists()


_KILLED_UPLOAD = """
import sys
from orchestrator.inventory import load_inventory
from orchestrator.transport.hosts import open_host
inv = load_inventory(sys.argv[1])
host = open_host(inv.hosts["evalhost"], inv)
host.put_bytes(b"x" * (256 << 20), sys.argv[2])
"""


def test_a_sender_killed_mid_upload_leaves_no_file_under_the_final_name(two_hosts, tmp_path):
    """The fault run's case: the controller SIGKILLed while its bytes are on the way."""
    folder = tmp_path / "prompts"
    path = folder / "4028f9989bb1b515-mid.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_UPLOAD, str(two_hosts), str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.time() + 60
    while time.time() < deadline and not any(
        p.stat().st_size > (1 << 20) for p in folder.glob("*.partial-*")
    ):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30  # sshd sees the connection close, the host's check runs
    while time.time() < deadline and _leftovers(folder):
        time.sleep(0.1)
    assert not path.exists()
    assert _leftovers(folder) == []


def test_a_content_addressed_file_is_checked_before_it_is_reused(two_hosts, tmp_path):
    """A file an older dflash left cut short under the final name is sent again, not
    reused; a whole one is reused as it is."""
    data = b'{"prompt": "hello"}\n' * 5000
    sha = hashlib.sha256(data).hexdigest()
    path = tmp_path / "prompts" / f"{sha[:16]}-mid.jsonl"
    path.parent.mkdir()
    path.write_bytes(data[:777])
    inv = load_inventory(two_hosts)
    with open_host(inv.hosts["evalhost"], inv) as host:
        assert not host.has_file(str(path), sha)
        carry_or_push(host, data, str(path), None)
        assert path.read_bytes() == data
        assert host.has_file(str(path), sha)
        stamp = path.stat().st_mtime_ns
        carry_or_push(host, data, str(path), None)
        assert path.stat().st_mtime_ns == stamp


def test_a_failed_upload_is_one_line_naming_the_path(two_hosts, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    for host in _hosts(two_hosts):
        with host, pytest.raises(HostError) as info:
            host.put_bytes(b"data", str(blocked / "under-a-file" / "x"))
        line = str(info.value)
        assert "\n" not in line and "could not write" in line and "nothing was put" in line
