"""`dflash relay` over two (and three) real loopback sshd hosts: no mocks.

Every test gets its own checkpoint and drafters folders under the servers' roots, so tests
do not see each other's checkpoints. Sizes are MiB-scale to keep the file fast.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator.inventory import load_inventory
from orchestrator.relay.run import Progress, RelayError, RelayOptions, list_checkpoints, relay
from tests.helpers.checkpoints import make_checkpoint, settled_size, tree
from tests.helpers.cli import ROOT, dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry, start_sshd

MiB = 1 << 20
_counter = itertools.count()


@pytest.fixture(scope="module")
def eval2_sshd(ssh_base, user_key):
    server = start_sshd(ssh_base, f"evalhost2-{os.getpid()}")
    yield server
    server.stop()


class Env:
    def __init__(self, inventory: Path, ckpt: Path, drafters: dict[str, Path]):
        self.inventory_path = inventory
        self.ckpt = ckpt
        self.drafters = drafters

    @property
    def inv(self):
        return load_inventory(self.inventory_path)

    def relay(self, dests=("evalhost",), progress=None, **opts):
        return relay(self.inv, "trainer", list(dests), RelayOptions(**opts), progress)

    @property
    def dst(self) -> Path:
        return self.drafters["evalhost"]


@pytest.fixture
def env(trainer_sshd, eval_sshd, eval2_sshd, ssh_base, make_inventory):
    """Fresh folders: trainer checkpoints, drafters on evalhost and evalhost2."""
    n = next(_counter)
    ckpt = trainer_sshd.root / f"ckpt-{n}"
    ckpt.mkdir()
    drafters = {
        "evalhost": eval_sshd.root / f"drafters-{n}",
        "evalhost2": eval2_sshd.root / f"drafters-{n}",
    }
    for d in drafters.values():
        d.mkdir()

    def write(trainer_role=None, eval_role=None):
        return make_inventory(
            hosts={
                "trainer": ssh_host_entry(
                    trainer_sshd,
                    ssh_base,
                    roles={"trainer": {"checkpoints": str(ckpt), **(trainer_role or {})}},
                ),
                "evalhost": ssh_host_entry(
                    eval_sshd,
                    ssh_base,
                    roles={"eval": {"drafters": str(drafters["evalhost"]), **(eval_role or {})}},
                ),
                "evalhost2": ssh_host_entry(
                    eval2_sshd, ssh_base, roles={"eval": {"drafters": str(drafters["evalhost2"])}}
                ),
            },
            defaults={"relay_from": "trainer", "relay_to": "evalhost"},
            groups={"evals": ["evalhost", "evalhost2"]},
        )

    e = Env(write(), ckpt, drafters)
    e.rewrite = lambda **kw: setattr(e, "inventory_path", write(**kw))
    return e


class KillAfter(Progress):
    """Kills every session of an sshd once `after` bytes went through: a dropped link."""

    def __init__(self, server, after: int):
        self.server, self.after, self.seen, self.killed = server, after, 0, False
        self.lock = threading.Lock()

    def advance(self, nbytes: int) -> None:
        with self.lock:
            self.seen += nbytes
            fire = self.seen >= self.after and not self.killed
            if fire:
                self.killed = True
        if fire:
            self.server.kill_sessions()


class Watcher(threading.Thread):
    """Polls a destination path during a relay; records any moment it held a partial
    checkpoint (a missing file or a file shorter than its final size)."""

    def __init__(self, final: Path, expected: dict[str, bytes]):
        super().__init__(daemon=True)
        self.final, self.expected = final, expected
        self.stop_flag = threading.Event()
        self.looks = self.seen_present = 0
        self.bad: list[str] = []

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.looks += 1
            if self.final.exists():
                self.seen_present += 1
                for rel, data in self.expected.items():
                    p = self.final / rel
                    if not p.is_file() or p.stat().st_size != len(data):
                        self.bad.append(rel)
            time.sleep(0.002)


# ---- tests --------------------------------------------------------------------------------


def test_multi_file_checkpoint_byte_exact_never_partial_then_unchanged_costs_nothing(env):
    files = make_checkpoint(
        env.ckpt,
        "step_1000",
        {
            "model.safetensors": 12 * MiB,
            "optimizer/part-0.bin": 5 * MiB + 3,
            "optimizer/part-1.bin": 3 * MiB,
            "config.json": 517,
            "empty.txt": 0,
        },
    )
    final = env.dst / "step_1000"
    watcher = Watcher(final, files)
    watcher.start()
    report = env.relay()
    watcher.stop_flag.set()
    watcher.join()
    assert report.ok, report.failures
    assert tree(final) == files
    assert watcher.looks > 10 and watcher.bad == []
    total = sum(map(len, files.values()))
    assert report.bytes_sent == report.bytes_read == total
    assert not (env.dst / ".partial-step_1000").exists()

    manifest = json.loads((final / ".dflash-manifest.json").read_text())
    assert manifest["step"] == 1000 and manifest["source"]["host"] == "trainer"
    assert manifest["source"]["path"] == f"{env.ckpt}/step_1000"
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()
    }
    assert {f["path"]: f["size"] for f in manifest["files"]} == {
        rel: len(data) for rel, data in files.items()
    }

    # Unchanged: nothing moves, and the CLI's JSON says so.
    proc = dflash(
        "relay",
        "--from",
        "trainer",
        "--to",
        "evalhost",
        "--json",
        "--inventory",
        str(env.inventory_path),
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["bytes_sent"] == 0 and summary["bytes_read"] == 0
    assert summary["bytes_skipped"] == total
    assert summary["checkpoints"][0]["destinations"]["evalhost"]["status"] == "unchanged"


def test_dropped_connection_resumes_inside_the_file(env, eval_sshd):
    files = make_checkpoint(
        env.ckpt, "checkpoint-8000", {"big.bin": 40 * MiB, "small.bin": 2 * MiB}
    )
    total = sum(map(len, files.values()))
    killer = KillAfter(eval_sshd, after=14 * MiB)
    report = env.relay(progress=killer, jobs=1)  # one stream for every file
    assert killer.killed and not report.ok
    assert "lost" in report.failures[0][2] or "exit" in report.failures[0][2]
    assert not (env.dst / "checkpoint-8000").exists()
    partial = env.dst / ".partial-checkpoint-8000" / "big.bin"
    have = settled_size(partial)
    assert 0 < have < 40 * MiB
    assert partial.read_bytes() == files["big.bin"][:have]  # a clean prefix
    # One stream carries the whole checkpoint (big.bin, then small.bin): small.bin, after
    # the break, was never started, so the partial folder holds big.bin's prefix only.
    kept = sum(settled_size(p) for p in partial.parent.iterdir())
    assert kept == have

    again = env.relay()
    assert again.ok, again.failures
    assert tree(env.dst / "checkpoint-8000") == files
    # Only what was missing moved: the kept prefix was verified, not re-sent.
    assert again.bytes_sent == total - kept  # big.bin resumed inside, at its byte offset
    assert again.checkpoints[0].destinations["evalhost"].bytes_skipped == kept


@pytest.mark.parametrize("how", ["states", "no source cache", "verify"])
def test_a_resume_at_a_saved_state_hashes_no_kept_prefix_again(env, trainer_sshd, eval_sshd, how):
    """Killed past a grid point, the relay resumes at the newest hash state the
    destination saved (its bytes after it are sent again): neither host reads the kept
    prefix back (prefix_hashed 0). Without the source's cache the source hashes it
    (the destination still does not); ``verify`` ignores saved states and resumes at the
    partial's length with the destination's prefix hashed, as before. No sidecar is
    published."""
    from remote.relay.sha256state import GRID, available

    if not available():
        pytest.skip("no resumable sha256 (libcrypto) on this host")
    files = make_checkpoint(env.ckpt, "step_40", {"big.bin": 3 * GRID + 5})
    total = 3 * GRID + 5
    killer = KillAfter(eval_sshd, after=2 * GRID + 8 * MiB)
    assert not env.relay(progress=killer, jobs=1).ok
    partial = env.dst / ".partial-step_40" / "big.bin"
    have = settled_size(partial)
    assert GRID <= have < total
    if how == "no source cache":
        for entry in (trainer_sshd.root / "dflash" / "relay-states").iterdir():
            entry.unlink()
    again = env.relay(verify=how == "verify")
    assert again.ok, again.failures
    assert tree(env.dst / "step_40") == files
    st = again.checkpoints[0].destinations["evalhost"]
    kept = st.bytes_skipped
    assert again.bytes_sent == total - kept
    if how == "verify":
        # the destination hashes its prefix; the source too, unless `have` happens to
        # lie on the grid, where its own saved state (bound to its file) serves
        assert kept == have and st.prefix_hashed == (have if have % GRID == 0 else 2 * have)
    else:
        assert kept % GRID == 0 and have - 2 * GRID < kept <= have
        assert st.prefix_hashed == (kept if how == "no source cache" else 0)
    assert not list((env.dst / "step_40").glob(".dflash-states-*"))


class Messages(Progress):
    def __init__(self):
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)


def test_a_wrong_saved_state_is_caught_by_the_hash_comparison_and_sent_again(env, eval_sshd):
    """A sidecar whose state passes every check but stands for other bytes (made up, or
    the prefix changed in place): the destination's whole-file hash then differs from the
    source's, the file is sent again from 0, and what is published is the source's."""
    from remote.relay.sha256state import GRID, Sha256, available

    if not available():
        pytest.skip("no resumable sha256 (libcrypto) on this host")
    size = 4 * GRID + 5
    files = make_checkpoint(env.ckpt, "step_41", {"big.bin": size})
    killer = KillAfter(eval_sshd, after=2 * GRID + 8 * MiB)
    assert not env.relay(progress=killer, jobs=1).ok
    partial = env.dst / ".partial-step_41" / "big.bin"
    assert settled_size(partial) >= GRID
    other = Sha256()
    other.update(os.urandom(GRID))
    sidecar = partial.parent / ".dflash-states-big.bin"
    doc = json.loads(sidecar.read_text())
    doc["states"] = {str(GRID): other.state().hex()}
    sidecar.write_text(json.dumps(doc))
    seen = Messages()
    again = env.relay(progress=seen)
    assert again.ok, again.failures
    assert tree(env.dst / "step_41") == files
    assert any("sha256 mismatch" in m and "big.bin" in m for m in seen.messages)
    assert again.bytes_read == (size - GRID) + size


def test_interrupted_multi_file_keeps_finished_files(env, eval_sshd):
    files = make_checkpoint(env.ckpt, "step_20", {f"shard-{i}.bin": 4 * MiB for i in range(6)})
    # One stream for the six files, cut after five of them went through this machine:
    # what the pipes and ssh buffers still held is lost, the files written before stay.
    killer = KillAfter(eval_sshd, after=20 * MiB)
    assert not env.relay(progress=killer, jobs=1).ok
    kept = sum(settled_size(p) for p in (env.dst / ".partial-step_20").rglob("*.bin"))
    assert kept >= 8 * MiB
    stray = env.dst / ".partial-step_20" / "gone-from-source.bin"
    stray.write_bytes(b"old")  # e.g. a file the trainer has since deleted
    again = env.relay()
    assert again.ok and tree(env.dst / "step_20") == files
    assert again.bytes_sent == sum(map(len, files.values())) - kept


class FlipWhenSendingStarts(Progress):
    """Flips one byte of a destination file the moment the transfer starts (after the
    plan verified it): the kept prefix of a resumed file goes bad on the way."""

    def __init__(self, path: Path, at: int):
        self.path, self.at, self.messages = path, at, []

    def start(self, total_bytes: int, total_files: int) -> None:
        with open(self.path, "r+b") as fh:
            fh.seek(self.at)
            byte = fh.read(1)
            fh.seek(self.at)
            fh.write(bytes([byte[0] ^ 0xFF]))

    def message(self, text: str) -> None:
        self.messages.append(text)


def test_a_hash_mismatch_is_sent_again_from_zero(env):
    files = make_checkpoint(env.ckpt, "step_9", {"model.bin": 6 * MiB + 5})
    data = files["model.bin"]
    partial = env.dst / ".partial-step_9" / "model.bin"
    partial.parent.mkdir(parents=True)
    kept = 2 * MiB + 17
    partial.write_bytes(data[:kept])  # a verified prefix: the relay resumes after it
    flip = FlipWhenSendingStarts(partial, at=1000)
    report = env.relay(progress=flip)
    assert report.ok, report.failures
    assert tree(env.dst / "step_9") == files
    # the destination's whole-file hash (bad prefix + good tail) disagreed with the
    # source's, so the file went again from byte 0
    assert any("sha256 mismatch" in m and "model.bin" in m for m in flip.messages)
    assert report.bytes_read == (len(data) - kept) + len(data)


class RelayWhenSendingStarts(Progress):
    """Runs a second relay into the same folder while the first is about to send."""

    def __init__(self, env):
        self.env, self.error = env, None

    def start(self, total_bytes: int, total_files: int) -> None:
        with pytest.raises(RelayError) as info:
            self.env.relay(lock_wait=0.5)
        self.error = str(info.value)


def test_a_second_relay_into_the_same_folder_is_refused_until_the_first_ends(env):
    files = make_checkpoint(env.ckpt, "step_3", {"w.bin": 3 * MiB})
    second = RelayWhenSendingStarts(env)
    assert env.relay(progress=second).ok
    assert "another dflash relay is writing to evalhost:" in second.error
    assert f"pid {os.getpid()}" in second.error  # it names the holder
    assert tree(env.dst / "step_3") == files
    assert not (env.dst / ".dflash-relay.lock").exists()  # released, nothing left behind
    assert env.relay(lock_wait=0.5).ok  # and the next relay takes it


class WaitingRelayWhenSendingStarts(Progress):
    """Starts a second relay into the same folder, willing to wait, while the first is
    about to send; it runs on in a thread."""

    def __init__(self, env):
        self.env, self.thread, self.report = env, None, None

    def start(self, total_bytes: int, total_files: int) -> None:
        def second() -> None:
            self.report = self.env.relay(names=["step_4"], lock_wait=120)

        self.thread = threading.Thread(target=second)
        self.thread.start()


def test_a_relay_waiting_for_the_lock_takes_it_when_the_first_ends(env):
    """The waiting holder blocks in flock (cut short by a timer at lock_wait), so it gets
    the folder the moment the first relay lets go, and relays in its turn."""
    files = make_checkpoint(env.ckpt, "step_3", {"w.bin": 3 * MiB})
    later = make_checkpoint(env.ckpt, "step_4", {"w.bin": 1 * MiB})
    waiting = WaitingRelayWhenSendingStarts(env)
    assert env.relay(names=["step_3"], progress=waiting).ok
    waiting.thread.join(timeout=120)
    assert waiting.report is not None and waiting.report.ok, waiting.report
    assert tree(env.dst / "step_3") == files and tree(env.dst / "step_4") == later
    assert not (env.dst / ".dflash-relay.lock").exists()


def test_publish_refuses_a_partial_folder_missing_a_file(tmp_path):
    """The host's last guard: whatever happened to a partial folder after it was checked,
    relay-publish renames nothing unless every manifest file is there at full size."""
    import subprocess
    import sys

    root = tmp_path / "drafters"
    (root / ".partial-step_4").mkdir(parents=True)
    (root / ".partial-step_4" / "a.bin").write_bytes(b"x" * 10)
    (root / ".partial-step_4" / "b.bin").write_bytes(b"y" * 3)  # short
    manifest = {"files": [{"path": "a.bin", "size": 10}, {"path": "b.bin", "size": 7}]}
    proc = subprocess.run(
        [sys.executable, "-m", "remote", "relay-publish", str(root), "step_4", "--kind", "dir"],
        input=json.dumps(manifest).encode(),
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 3
    assert "step_4 is not published: b.bin holds 3 bytes" in proc.stderr.decode()
    assert not (root / "step_4").exists() and (root / ".partial-step_4" / "a.bin").exists()


def test_verify_detects_and_repairs_a_flipped_byte(env):
    files = make_checkpoint(env.ckpt, "step_7", {"a.bin": 3 * MiB, "b.bin": 2 * MiB})
    assert env.relay().ok
    damaged = env.dst / "step_7" / "b.bin"
    data = bytearray(damaged.read_bytes())
    data[1234567] ^= 0x01
    stat = damaged.stat()
    damaged.write_bytes(bytes(data))
    os.utime(damaged, (stat.st_atime, stat.st_mtime))  # same size, same mtime: sneaky

    assert env.relay().bytes_sent == 0  # without --verify the manifest is trusted
    report = env.relay(verify=True)
    st = report.checkpoints[0].destinations["evalhost"]
    assert st.status == "repaired" and st.repaired == ["b.bin"]
    assert st.bytes_sent == 2 * MiB  # only the damaged file
    assert tree(env.dst / "step_7") == files
    clean = env.relay(verify=True).checkpoints[0].destinations["evalhost"]
    assert clean.status == "verified" and clean.bytes_sent == 0


def test_half_written_checkpoints_are_not_relayed(env):
    make_checkpoint(env.ckpt, "step_100", {"w.bin": MiB})
    make_checkpoint(env.ckpt, "step_200", {"w.bin": MiB}, marker=False)  # trainer not done
    report = env.relay(all=True)
    assert [c.name for c in report.checkpoints] == ["step_100"]
    assert report.incomplete[0]["name"] == "step_200"
    assert "COMPLETE" in report.incomplete[0]["reason"]
    assert not (env.dst / "step_200").exists()
    assert not (env.dst / ".partial-step_200").exists()
    # --latest picks the newest COMPLETE one.
    assert [c.name for c in env.relay(latest=True).checkpoints] == ["step_100"]


def test_stable_rule_skips_a_checkpoint_still_growing(env):
    env.rewrite(trainer_role={"complete_rule": "stable", "stable_seconds": 1})
    make_checkpoint(env.ckpt, "step_1", {"w.bin": MiB}, marker=False)
    old = time.time() - 60
    os.utime(env.ckpt / "step_1" / "w.bin", (old, old))
    growing = env.ckpt / "step_2" / "w.bin"
    growing.parent.mkdir()
    stop = threading.Event()

    def writer():
        with open(growing, "ab") as fh:
            while not stop.is_set():
                fh.write(os.urandom(4096))
                fh.flush()
                time.sleep(0.05)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        report = env.relay(all=True)
    finally:
        stop.set()
        t.join()
    assert [c.name for c in report.checkpoints] == ["step_1"]
    assert report.incomplete[0]["name"] == "step_2"
    assert "still being written" in report.incomplete[0]["reason"]


def test_not_enough_space_is_refused_before_any_byte_moves(env):
    make_checkpoint(env.ckpt, "step_5", {"w.bin": 2 * MiB})
    free = os.statvfs(env.dst).f_bavail * os.statvfs(env.dst).f_frsize
    # The reserve leaves less room than the checkpoint needs: refused, with the numbers.
    env.rewrite(eval_role={"reserve": free + 64 * MiB})
    proc = dflash("relay", "--inventory", str(env.inventory_path))
    assert proc.returncode != 0
    line = one_error_line(proc)
    assert "not enough space" in line and "needs 2.0 MiB" in line and "reserve" in line
    assert list(env.dst.iterdir()) == []  # no partial folder, nothing published, no lock left
    with pytest.raises(RelayError, match="short by"):
        env.relay(reserve=free + 64 * MiB)
    assert env.relay(reserve=0).ok  # the same relay with no reserve fits


def test_hostile_names_arrive_byte_exact_and_nothing_runs(env):
    token = f"PWNED-{os.getpid()}-{next(_counter)}"
    evil = f"$(cd;touch {token})"  # no '/': it must be usable as a file name
    name = f'-step_9 it\'s "q" {evil};touch {token}'
    files = make_checkpoint(
        env.ckpt,
        name,
        {
            "a b.bin": MiB,
            "it's.bin": 1000,
            f"{evil}.bin": 2000,
            f"x;touch {token}": 3,
            "-rf": 10,
            "sub dir/`touch x`.bin": 5,
            "--kind=file": 6,
        },
    )
    report = env.relay(names=[name])
    assert report.ok, report.failures
    assert tree(env.dst / name) == files
    homes = {Path.home(), Path(os.path.expanduser("~" + (os.environ.get("USER") or "root")))}
    for where in [*homes, Path.cwd(), env.ckpt, env.dst]:
        assert not (where / token).exists()
    assert report.checkpoints[0].step == 9
    proc = dflash("relay", "--inventory", str(env.inventory_path), "--json", "--", name)
    assert proc.returncode == 0 and json.loads(proc.stdout)["bytes_sent"] == 0


def test_single_file_checkpoint(env):
    data = os.urandom(3 * MiB + 7)
    (env.ckpt / "step_300.pt").write_bytes(data)
    env.rewrite(trainer_role={"complete_rule": "stable", "stable_seconds": 0.2})
    time.sleep(0.3)
    report = env.relay(step=300)
    assert report.ok and (env.dst / "step_300.pt").read_bytes() == data
    manifest = json.loads((env.dst / ".step_300.pt.dflash-manifest.json").read_text())
    assert manifest["files"][0]["sha256"] == hashlib.sha256(data).hexdigest()
    assert env.relay(step=300).bytes_sent == 0


def test_fan_out_reads_once_and_a_failed_destination_spares_the_other(env, eval2_sshd):
    files = make_checkpoint(env.ckpt, "step_1", {"a.bin": 6 * MiB, "b.bin": 3 * MiB})
    total = sum(map(len, files.values()))
    report = env.relay(dests=["evalhost", "evalhost2"])
    assert report.ok, report.failures
    assert report.bytes_read == total and report.bytes_sent == 2 * total
    for d in env.drafters.values():
        assert tree(d / "step_1") == files

    files2 = make_checkpoint(env.ckpt, "step_2", {"a.bin": 30 * MiB, "b.bin": MiB})
    total2 = sum(map(len, files2.values()))
    killer = KillAfter(eval2_sshd, after=10 * MiB)
    report = env.relay(dests=["evals"], progress=killer, jobs=1)  # a group name works too
    sts = report.checkpoints[0].destinations
    assert sts["evalhost"].status == "relayed" and sts["evalhost2"].status == "failed"
    assert tree(env.drafters["evalhost"] / "step_2") == files2
    assert not (env.drafters["evalhost2"] / "step_2").exists()
    again = env.relay(dests=["evalhost", "evalhost2"])
    sts = again.checkpoints[0].destinations
    assert sts["evalhost"].status == "unchanged" and sts["evalhost2"].status == "relayed"
    assert sts["evalhost2"].bytes_sent < total2
    assert tree(env.drafters["evalhost2"] / "step_2") == files2


def test_keep_list_and_dry_run(env):
    for step in (100, 200, 300):
        make_checkpoint(env.ckpt, f"step_{step}", {"w.bin": 100_000})
    (env.dst / "mine").mkdir()  # not relayed by dflash: never pruned
    plan = dflash("relay", "--all", "--dry-run", "--json", "--inventory", str(env.inventory_path))
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["bytes_planned"] == 3 * 100_000
    assert planned["bytes_sent"] == 0 and sorted(p.name for p in env.dst.iterdir()) == ["mine"]
    report = env.relay(all=True, keep=2)
    assert report.pruned["evalhost"] == ["step_100"]
    assert sorted(p.name for p in env.dst.iterdir()) == ["mine", "step_200", "step_300"]
    listing = list_checkpoints(env.inv, "trainer", ["evalhost"])
    states = {r["name"]: r["destinations"]["evalhost"] for r in listing["checkpoints"]}
    assert states == {"step_100": "no", "step_200": "relayed", "step_300": "relayed"}
    table = dflash("relay", "--list", "--inventory", str(env.inventory_path))
    assert table.returncode == 0 and "step_300" in table.stdout and "relayed" in table.stdout


def test_openssh_streams_honour_the_inventory(
    env, trainer_sshd, eval_sshd, ssh_base, make_inventory, tmp_path
):
    """The ssh processes that carry the bytes refuse unknown host keys like the paramiko
    connections do, accept-new only on opt-in, and reach a host through an inventory jump."""
    import subprocess

    from orchestrator.transport.hosts import open_host
    from orchestrator.transport.openssh_host import stream_argv

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = load_inventory(
        make_inventory(
            {
                "strict": ssh_host_entry(eval_sshd, ssh_base, known_hosts=str(empty)),
                "trusting": ssh_host_entry(
                    eval_sshd, ssh_base, known_hosts=str(empty), accept_new_host_key=True
                ),
                "trainer": ssh_host_entry(trainer_sshd, ssh_base),
                "behind": ssh_host_entry(eval_sshd, ssh_base, jump="trainer"),
            }
        )
    )

    def argv(name: str, line: str = 'printf %s "$SSH_CONNECTION"') -> list[str]:
        return stream_argv(open_host(inv.hosts[name], inv), line, inv)

    home = {**os.environ, "HOME": str(tmp_path)}  # no ~/.ssh/known_hosts to fall back on

    def run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv(name), capture_output=True, text=True, env=home, timeout=30)

    refused = run("strict")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    assert empty.read_text() == ""
    assert run("trusting").returncode == 0
    key_b64 = eval_sshd.known_hosts_line().split()[2]
    assert key_b64 in empty.read_text()  # remembered, like accept-new (maybe name-hashed)
    assert run("strict").returncode == 0  # now known

    # Through the jump host: while the command runs, the trainer serves the tunnel.
    before = len(trainer_sshd.sessions())
    proc = subprocess.Popen(
        argv("behind", "sleep 2; printf ok"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    most = before
    while proc.poll() is None:
        most = max(most, len(trainer_sshd.sessions()))
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0 and out == "ok", err
    assert most > before


def test_openssh_streams_trust_the_known_hosts_that_ssh_config_names(
    eval_sshd, ssh_base, make_inventory, tmp_path, monkeypatch
):
    """A host whose key is recorded only in a file named by ~/.ssh/config's
    UserKnownHostsFile is trusted by the relay's ssh streams as by `dflash hosts check`."""
    import subprocess

    from orchestrator.transport.hosts import open_host
    from orchestrator.transport.openssh_host import stream_argv

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host 127.0.0.1\n  UserKnownHostsFile {ssh_base / 'known_hosts'}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    entry = ssh_host_entry(eval_sshd, ssh_base)
    del entry["known_hosts"]
    inv = load_inventory(make_inventory({"ct": entry}))
    host = open_host(inv.hosts["ct"], inv)
    with host:
        assert host.run(["printf", "%s", "paramiko"]).stdout == "paramiko"
        proc = subprocess.run(
            stream_argv(host, "printf %s openssh", inv), capture_output=True, text=True, timeout=30
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "openssh"


def test_ctrl_c_keeps_what_arrived_and_the_next_relay_resumes(env):
    import signal
    import subprocess
    import sys

    files = make_checkpoint(env.ckpt, "step_42", {"big.bin": 48 * MiB})
    partial = env.dst / ".partial-step_42" / "big.bin"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "relay",
            "--json",
            "--inventory",
            str(env.inventory_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    while proc.poll() is None and not (partial.exists() and partial.stat().st_size > 4 * MiB):
        time.sleep(0.01)
    assert proc.poll() is None, "the relay finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert not (env.dst / "step_42").exists()
    have = settled_size(partial)
    assert 0 < have < 48 * MiB and partial.read_bytes() == files["big.bin"][:have]
    again = env.relay()
    assert again.ok and tree(env.dst / "step_42") == files
    # it resumes where the cut left it, or (a cut past 16 MiB) at the last offset a hash
    # state was saved for, with no kept prefix hashed again
    from remote.relay.sha256state import GRID

    st = again.checkpoints[0].destinations["evalhost"]
    kept = st.bytes_skipped
    assert again.bytes_sent == 48 * MiB - kept
    assert kept == have or (kept % GRID == 0 and 0 < kept < have and st.prefix_hashed == 0)


@pytest.mark.parametrize("where,buffered", [("disk", False), ("disk", True), ("tmpfs", False)])
def test_relay_recv_writes_frames_byte_exact_direct_or_buffered(tmp_path, where, buffered):
    """relay-recv writes aligned blocks with O_DIRECT where the filesystem allows it and
    buffered writes where it does not (or DFLASH_RELAY_BUFFERED=1 says so); every way
    gives the same bytes and hashes, for a fresh file and one resumed at an unaligned
    offset."""
    import subprocess
    import sys
    import tempfile

    from remote.protocol import FRAME_HEADER as HEADER

    if where == "tmpfs":
        if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
            pytest.skip("no writable /dev/shm here")
        base = Path(tempfile.mkdtemp(prefix="dflash-recv-", dir="/dev/shm"))
    else:
        base = tmp_path
    try:
        fresh = os.urandom(5 * 1024 * 1024 + 123)  # several aligned blocks and a tail
        whole = os.urandom(3 * 1024 * 1024 + 7)
        kept = 4096 * 3 + 1001  # resume after an unaligned prefix
        part = base / ".partial-step_1"
        part.mkdir()
        (part / "resumed.bin").write_bytes(whole[:kept] + b"stale bytes after the offset")
        requests = [
            {"path": ".partial-step_1/sub dir/fresh.bin", "offset": 0},
            {"path": ".partial-step_1/resumed.bin", "offset": kept},
        ]
        stream = HEADER.pack(len(json.dumps(requests))) + json.dumps(requests).encode()
        for data in (fresh, whole[kept:]):
            stream += HEADER.pack(len(data)) + data
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "DFLASH_RELAY_BUFFERED": "1" if buffered else "0"}
        proc = subprocess.run(
            [sys.executable, "-m", "remote", "relay-recv", "--", str(base)],
            input=stream,
            capture_output=True,
            cwd=root,
            timeout=60,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        first, *rest = map(json.loads, proc.stdout.decode().splitlines())
        assert first == {"ready": True}  # printed at once, before the request is read
        lines = {r["i"]: r for r in rest}
        assert (part / "sub dir" / "fresh.bin").read_bytes() == fresh
        assert (part / "resumed.bin").read_bytes() == whole
        assert lines[0] == {"i": 0, "sha256": hashlib.sha256(fresh).hexdigest(), "size": len(fresh)}
        assert lines[1] == {
            "i": 1,
            "sha256": hashlib.sha256(whole).hexdigest(),
            "size": len(whole),
            "prefix_read": kept,  # no saved state at an unaligned offset: read again
        }
    finally:
        if where == "tmpfs":
            import shutil

            shutil.rmtree(base, ignore_errors=True)


def test_relay_send_frames_resumed_files_and_hashes_them_whole(tmp_path):
    """relay-send signals ready (an empty frame), then sends each file from its offset as
    one frame; a resumed file is hashed WHOLE in a thread while later files stream, and
    every file's line gives the sha256 of the whole file, whatever its offset."""
    import subprocess
    import sys

    from orchestrator.relay.stream import file_lines
    from remote.protocol import FRAME_HEADER as HEADER

    files = {"a.bin": 3 * 1024 * 1024 + 7, "b.bin": 5 * 1024 * 1024 + 1, "c.bin": 4096}
    offsets = {"a.bin": 1024 * 1024 + 3, "b.bin": 0, "c.bin": 4096}  # c: whole already
    data = {}
    for name, size in files.items():
        data[name] = os.urandom(size)
        (tmp_path / name).write_bytes(data[name])
    request = [{"path": str(tmp_path / n), "offset": offsets[n]} for n in files]
    proc = subprocess.run(
        [sys.executable, "-m", "remote", "relay-send"],
        input=json.dumps(request).encode(),
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout
    assert HEADER.unpack(out[: HEADER.size])[0] == 0  # ready
    pos = HEADER.size
    for name in files:
        (length,) = HEADER.unpack(out[pos : pos + HEADER.size])
        pos += HEADER.size
        assert out[pos : pos + length] == data[name][offsets[name] :]
        pos += length
    assert pos == len(out)
    lines = file_lines(proc.stderr.decode())
    for i, name in enumerate(files):
        want = {"i": i, "sha256": hashlib.sha256(data[name]).hexdigest(), "size": files[name]}
        if offsets[name]:  # no saved state: the kept prefix was read and hashed again
            want["prefix_read"] = offsets[name]
        assert lines[i] == want


def test_local_transport_hosts_relay_publish_and_verify(tmp_path, make_inventory):
    """Hosts on the local transport (the demo's) go through the same session: the lock
    holder answers publish and verify requests on its pipe (each delivered at once)."""
    import sys

    src, dst = tmp_path / "ckpts", tmp_path / "drafters"
    (src / "step_3").mkdir(parents=True)
    payload = os.urandom(3 * 1024 * 1024 + 5)
    (src / "step_3" / "model.safetensors").write_bytes(payload)
    (src / "step_3" / "COMPLETE").write_bytes(b"")

    def local(**roles) -> dict:
        return {
            "transport": "local",
            "python": sys.executable,
            "workdir": str(tmp_path / "work"),
            "roles": roles,
        }

    inv = load_inventory(
        make_inventory(
            {
                "trainer": local(trainer={"checkpoints": str(src)}),
                "evalbox": local(eval={"drafters": str(dst)}),
            }
        )
    )
    report = relay(inv, "trainer", ["evalbox"])
    assert report.ok and report.bytes_sent == len(payload)
    assert (dst / "step_3" / "model.safetensors").read_bytes() == payload
    again = relay(inv, "trainer", ["evalbox"], RelayOptions(verify=True))
    status = again.checkpoints[0].destinations["evalbox"]
    assert again.ok and status.status == "verified" and again.bytes_sent == 0
