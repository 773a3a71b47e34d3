"""The relay's trust boundaries and exit paths over real loopback sshd hosts (issue 12).

Every host is its own trust domain: what a host answers is checked before use, writes
never follow symlinks, and a relay ends its ssh masters however it ends. A "lying" host is
a real one whose ``python`` (from the inventory) is a wrapper that runs the real host-side
command and rewrites its JSON answer: nothing of the controller is mocked.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.checkpoints import make_checkpoint, settled_size, tree
from tests.helpers.cli import ROOT, dflash, one_error_line

MiB = 1 << 20
_n = itertools.count()

# ---- symlinks in a checkpoint (HF cache layout) ------------------------------------------


def test_hf_cache_layout_links_are_relayed_by_content(tenv):
    """Weight files that are links to blobs outside the snapshot folder arrive as regular
    files with the blob's bytes, marked as links in the manifest. Before: dropped, and the
    checkpoint published without its weights."""
    blobs = tenv.ckpt.parent / f"blobs-{tenv.ckpt.name}"
    blobs.mkdir()
    weights = os.urandom(3 * MiB + 5)
    (blobs / "abc123").write_bytes(weights)
    files = make_checkpoint(tenv.ckpt, "step_7", {"config.json": 100})
    (tenv.ckpt / "step_7" / "model.safetensors").symlink_to(blobs / "abc123")
    report = tenv.relay(names=["step_7"])
    assert report.ok, report.failures
    got = tenv.dst / "step_7" / "model.safetensors"
    assert not got.is_symlink() and got.read_bytes() == weights
    assert tree(tenv.dst / "step_7") == {**files, "model.safetensors": weights}
    manifest = json.loads((tenv.dst / "step_7" / ".dflash-manifest.json").read_text())
    entry = {f["path"]: f for f in manifest["files"]}["model.safetensors"]
    assert entry.get("link") is True and entry["sha256"] == hashlib.sha256(weights).hexdigest()
    again = tenv.relay(names=["step_7"])
    assert again.ok and again.bytes_sent == 0  # unchanged: nothing sent again


# ---- names starting with "-" ------------------------------------------------------------


@pytest.mark.parametrize("name", ["-h", "--kind=file", "-step_3"])
def test_names_starting_with_a_dash_are_published(tenv, name):
    """Before: the host-side publish parsed such a name as an option ('-h' printed help
    and exited 0: reported relayed, never published)."""
    files = make_checkpoint(tenv.ckpt, name, {"w.bin": 4096, "-x.bin": 10})
    proc = tenv.cli("--", name)
    assert proc.returncode == 0, proc.stderr
    assert tree(tenv.dst / name) == files
    assert not (tenv.dst / f".partial-{name}").exists()


# ---- a re-relay sees deleted and truncated files without --verify ------------------------


def test_deleted_or_truncated_published_files_are_resent_without_verify(tenv):
    """Before: reported "unchanged", 0 bytes sent, the damage left in place."""
    files = make_checkpoint(
        tenv.ckpt, "step_8", {"a.bin": MiB, "sub/b.bin": 2 * MiB, "c.bin": 1000}
    )
    assert tenv.relay().ok
    (tenv.dst / "step_8" / "a.bin").unlink()
    with open(tenv.dst / "step_8" / "sub" / "b.bin", "r+b") as fh:
        fh.truncate(MiB)
    report = tenv.relay()
    assert report.ok, report.failures
    st = report.checkpoints[0].destinations["evalhost"]
    assert st.status == "repaired" and sorted(st.repaired) == ["a.bin", "sub/b.bin"]
    assert report.bytes_sent == 3 * MiB  # the two damaged files, nothing else
    assert tree(tenv.dst / "step_8") == files
    assert tenv.relay().bytes_sent == 0  # and now it is unchanged again


# ---- errors name the side that failed ---------------------------------------------------


def test_a_full_destination_disk_is_named_with_the_os_error(tenv):
    """The eval host runs out of space (inodes of a small tmpfs) mid-relay. Before: the
    message blamed the trainer ('trainer: exit -9: ...') and never said 'no space'."""
    small = tenv.evalh.root / f"small-{next(_n)}"
    small.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=8", "tmpfs", str(small)],
            capture_output=True,
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        tenv.eval_drafters = small
        make_checkpoint(tenv.ckpt, "step_8", {f"f{i:02d}.bin": 1000 for i in range(12)})
        proc = tenv.cli("step_8")
        line = one_error_line(proc)
        assert proc.returncode == 1
        assert "evalhost: no space left on device while writing step_8/f" in line, line
        assert "trainer" not in line
        assert not (small / "step_8").exists()  # never published half
    finally:
        subprocess.run(["umount", "-l", str(small)])


# ---- signals and ssh masters ------------------------------------------------------------


def _masters_of(pid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if f"dfr-{pid}-" in cmd and "-M" in (p.info["cmdline"] or []):
            out.append(p)
    return out


def _start_cli_relay(tenv, name: str, partial: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "relay",
            "--json",
            "--inventory",
            str(tenv.inventory_path),
            "--",
            name,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    while proc.poll() is None and not (partial.exists() and partial.stat().st_size > 4 * MiB):
        time.sleep(0.01)
    assert proc.poll() is None, "the relay finished before it could be stopped"
    return proc


def _wait_gone(pid: int, timeout: float = 10) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := _masters_of(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_sigterm_is_a_clean_interrupt_with_exit_143(tenv):
    """Before: exit -15 with no message, both masters left running, the temp folder left."""
    files = make_checkpoint(tenv.ckpt, "step_9", {"big.bin": 64 * MiB})
    partial = tenv.dst / ".partial-step_9" / "big.bin"
    proc = _start_cli_relay(tenv, "step_9", partial)
    assert _masters_of(proc.pid), "the relay runs no ssh master to check"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 143 and len(lines) == 1 and "terminated" in lines[0], err
    assert not _wait_gone(proc.pid)
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"dfr-{proc.pid}-*"))
    assert not (tenv.dst / "step_9").exists()
    have = settled_size(partial)
    assert partial.read_bytes() == files["big.bin"][:have]  # what arrived is kept, intact


def test_kill_9_leaves_no_ssh_master_and_the_next_relay_resumes(tenv):
    """Before: both ControlMaster processes kept a session on their hosts forever."""
    files = make_checkpoint(tenv.ckpt, "step_10", {"big.bin": 64 * MiB})
    partial = tenv.dst / ".partial-step_10" / "big.bin"
    proc = _start_cli_relay(tenv, "step_10", partial)
    assert _masters_of(proc.pid)
    proc.kill()
    proc.communicate(timeout=30)
    assert not _wait_gone(proc.pid), "ssh masters outlived their relay"
    report = tenv.relay(names=["step_10"])  # also removes the dead relay's socket folder
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_10") == files
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"dfr-{proc.pid}-*"))


# ---- messages ------------------------------------------------------------------------------


def test_a_port_that_closes_at_once_is_not_called_a_timeout(make_inventory):
    """A TCP server that closes every connection at once. Before: 'no SSH greeting within
    5s (timed out)' printed after a few milliseconds."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        inv = make_inventory(
            hosts={
                "closer": {
                    "hostname": "127.0.0.1",
                    "port": srv.getsockname()[1],
                    "connect_timeout": 5,
                }
            }
        )
        t0 = time.monotonic()
        proc = dflash("hosts", "check", "closer", "--inventory", str(inv))
        took = time.monotonic() - t0
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        # Before any greeting as a rule; a reset of our own banner's write on a busy box
        assert "closed the connection" in out and "is that port really sshd" in out, out
        assert "within 5" not in out and took < 30
    finally:
        stop.set()
        srv.close()


def test_links_planted_in_a_published_checkpoint_are_replaced_not_written_through(tenv):
    """A published file swapped for a link to a file outside, another for a link to a
    folder outside, and the lock's info file for a link to a file outside: the next relay
    puts the real files back and writes nothing outside (a plain `mv` would have moved the
    repaired file INTO the linked folder; the lock wrote its JSON through the link)."""
    files = make_checkpoint(tenv.ckpt, "step_11", {"a.bin": 5000, "b.bin": 7000})
    assert tenv.relay().ok
    pub = tenv.dst / "step_11"
    (pub / "a.bin").unlink()
    (pub / "a.bin").symlink_to(tenv.outside / "sentinel.bin")
    (pub / "b.bin").unlink()
    (pub / "b.bin").symlink_to(tenv.outside, target_is_directory=True)
    (tenv.dst / ".dflash-relay.lock").symlink_to(tenv.outside / "sentinel.bin")
    report = tenv.relay()
    assert report.ok, report.failures
    assert sorted(report.checkpoints[0].destinations["evalhost"].repaired) == ["a.bin", "b.bin"]
    assert not (pub / "a.bin").is_symlink() and not (pub / "b.bin").is_symlink()
    assert tree(pub) == files
    tenv.outside_intact()
