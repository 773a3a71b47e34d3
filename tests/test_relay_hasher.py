"""The host-side hashes of a relay.

- `remote.relay.hasher.Hasher`, the fallback for a resumed file without a saved state: a
  kept prefix read from the file (with O_DIRECT where the filesystem takes it), then the
  new bytes, from memory as far as its budget allows and read back from the file past
  that, always giving the sha256 of the whole file;
- `remote.relay.sha256state`: a sha256 whose state is saved and restored (hashlib's
  digests, whatever the split), and `remote.relay.states`: the states both hosts save
  while a file moves (destination sidecar, source cache), used by a resume so that no
  kept prefix is hashed again, and refused (the prefix hashed instead) when tampered
  with, stale, or bound to another file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from remote.protocol import FRAME_HEADER
from remote.relay import sha256state, states
from remote.relay.hasher import Hasher
from remote.relay.pipes import CHUNK
from remote.relay.scan import scan_root
from remote.relay.sha256state import GRID, Sha256, state_problem

MiB = 1024 * 1024


@pytest.fixture(params=["disk", "tmpfs"])
def folder(request, tmp_path):
    if request.param == "disk":
        yield tmp_path
        return
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    base = Path(tempfile.mkdtemp(prefix="dflash-hasher-", dir="/dev/shm"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("keep", [0, CHUNK + MiB, 64 * MiB])
def test_resumed_file_hash_is_the_whole_files(folder, direct, keep):
    """Prefix from the file, then pieces handed over as written: kept in memory while
    they fit in `keep`, read back from the file when not (keep=0: all read back), over
    unaligned sizes; a filesystem that refuses O_DIRECT (tmpfs) is read through the cache."""
    data = os.urandom(11 * MiB + 4321)
    prefix = 2 * MiB + 4097  # unaligned: the reads after it are unaligned too
    path = folder / "f.bin"
    path.write_bytes(data[:prefix])
    fd = os.open(path, os.O_RDWR)
    try:
        hasher = Hasher(fd, prefix, direct=direct, keep=keep)
        pos = prefix
        for step in (MiB, 4 * MiB + 1, 3, 3 * MiB, len(data)):
            piece = data[pos : pos + step]
            if not piece:
                break
            os.pwrite(fd, piece, pos)
            pos += len(piece)
            hasher.advance(pos, memoryview(piece))
        assert pos == len(data)
        assert hasher.result(len(data)) == hashlib.sha256(data).hexdigest()
        assert hasher.queued == 0  # every queued piece was used or passed
    finally:
        os.close(fd)


def test_a_file_that_shrinks_while_hashed_is_an_error(tmp_path):
    """Asked for more bytes than the file holds, the hash fails instead of answering for
    a shorter file."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        hasher = Hasher(fd, MiB)
        with pytest.raises(OSError):
            hasher.result(2 * MiB)
    finally:
        os.close(fd)


# ---- resumable sha256 and the saved states of a relay ----------------------------------

ROOT = Path(__file__).resolve().parent.parent
needs_states = pytest.mark.skipif(
    not sha256state.available(), reason="no resumable sha256 (libcrypto) on this host"
)


@needs_states
@pytest.mark.parametrize("seed", range(4))
def test_resumable_sha256_equals_hashlib_split_and_restored_anywhere(seed):
    """Random data fed in random pieces (bytes, bytearray, memoryview slices), the state
    saved and restored into a new object at random points: always hashlib's digest."""
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(1, 3 * MiB))
    h, pos = Sha256(), 0
    while pos < len(data):
        step = rng.choice([1, 63, 64, 65, 4096, rng.randrange(1, MiB)])
        piece = data[pos : pos + step]
        h.update(rng.choice([bytes, bytearray, lambda b: memoryview(bytearray(b))])(piece))
        pos += len(piece)
        if rng.random() < 0.3:
            h = Sha256.resume(h.state(), pos)
        assert h.length == pos
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert Sha256().hexdigest() == hashlib.sha256(b"").hexdigest()


@needs_states
def test_a_state_is_refused_at_any_other_offset_or_when_made_up():
    h = Sha256()
    h.update(os.urandom(1000))
    state = h.state()
    assert state_problem(state, 1000) is None
    assert Sha256.resume(state, 1000) is not None
    for offset in (0, 999, 1001, 1000 + 64):
        assert state_problem(state, offset) and Sha256.resume(state, offset) is None
    assert Sha256.resume(state[:-1], 1000) is None
    assert Sha256.resume(bytes(len(state)), 1000) is None


def test_resumable_sha256_throughput_is_printed_not_asserted(capsys):
    """Prints MiB/s of hashlib and of the resumable sha256 on 64 MiB (4 MiB blocks);
    a speed goal is a benchmark's, not a test's: this only shows the figure."""
    import time

    if not sha256state.available():
        pytest.skip("no resumable sha256 here")
    buf = memoryview(bytearray(os.urandom(4 * MiB)))
    out = {}
    for name, h in (("hashlib", hashlib.sha256()), ("resumable", Sha256())):
        start = time.perf_counter()
        for _ in range(16):
            h.update(buf)
        out[name] = 64 / (time.perf_counter() - start)
    with capsys.disabled():
        print(f"\nsha256 MiB/s: hashlib {out['hashlib']:.0f}, resumable {out['resumable']:.0f}")
    assert out["resumable"] > 0


def _send(request: list, cache: Path) -> tuple[bytes, dict]:
    env = {**os.environ, "DFLASH_RELAY_STATES": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "remote", "relay-send"],
        input=json.dumps(request).encode(),
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(x) for x in proc.stderr.decode().splitlines() if x.startswith("{")]
    return proc.stdout, {r["i"]: r for r in lines}


@needs_states
def test_source_resumes_from_its_saved_state_until_the_file_changes(tmp_path):
    """A file sent whole leaves its states (every GRID bytes) in the source's cache; a
    resume at a grid point hashes no prefix (prefix_read 0) and still answers the whole
    file's sha256; a tampered cache, or the file touched since, falls back to reading
    the prefix, with the right digest."""
    cache = tmp_path / "cache"
    path = tmp_path / "model.bin"
    data = os.urandom(2 * GRID + 12345)
    path.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    _, lines = _send([{"path": str(path), "offset": 0}], cache)
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data)}
    (entry,) = cache.iterdir()
    assert sorted(json.loads(entry.read_text())["states"]) == [str(GRID), str(2 * GRID)]

    out, lines = _send([{"path": str(path), "offset": GRID}], cache)
    assert out[FRAME_HEADER.size * 2 :] == data[GRID:]  # ready frame, then the file's
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data), "prefix_read": 0}

    doc = json.loads(entry.read_text())
    good = doc["states"][str(GRID)]
    doc["states"][str(GRID)] = good[:-2] + ("00" if good[-2:] != "00" else "01")
    entry.write_text(json.dumps(doc))  # a made-up state: refused when read
    _, lines = _send([{"path": str(path), "offset": GRID}], cache)
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data), "prefix_read": GRID}

    doc["states"][str(GRID)] = good
    entry.write_text(json.dumps(doc))
    os.utime(path, ns=(1, 1))  # the same bytes, but its identity changed: not trusted
    _, lines = _send([{"path": str(path), "offset": GRID}], cache)
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data), "prefix_read": GRID}


def _recv(root: Path, requests: list, payloads: list[bytes]) -> dict:
    stream = FRAME_HEADER.pack(len(json.dumps(requests))) + json.dumps(requests).encode()
    for data in payloads:
        stream += FRAME_HEADER.pack(len(data)) + data
    proc = subprocess.run(
        [sys.executable, "-m", "remote", "relay-recv", "--", str(root)],
        input=stream,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(x) for x in proc.stdout.decode().splitlines()[1:]]
    return {r["i"]: r for r in lines}


@needs_states
def test_destination_saves_states_and_resumes_from_them_or_falls_back(tmp_path):
    """A received partial file gets a sidecar of durable states, which its scan reports
    as ``resume``; a resume at that offset reads no prefix back (prefix_read 0); a
    sidecar of another file (inode) or a state made up is ignored: the prefix is read
    and hashed, and the digest is still the whole file's. Publication leaves no sidecar."""
    data = os.urandom(2 * GRID + 4097)
    want = hashlib.sha256(data).hexdigest()
    rel = ".partial-step_1/model.bin"
    part = tmp_path / ".partial-step_1"
    lines = _recv(tmp_path, [{"path": rel, "offset": 0}], [data])
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data)}
    sidecar = part / (states.SIDECAR_PREFIX + "model.bin")
    assert sorted(json.loads(sidecar.read_text())["states"]) == [str(GRID), str(2 * GRID)]
    (entry,) = scan_root(str(tmp_path))["partials"]["step_1"]
    assert entry["resume"] == 2 * GRID and "dflash" not in json.dumps(entry)

    # not asked to use a saved state (--verify): the prefix is read and hashed again
    lines = _recv(tmp_path, [{"path": rel, "offset": 2 * GRID}], [data[2 * GRID :]])
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data), "prefix_read": 2 * GRID}
    lines = _recv(tmp_path, [{"path": rel, "offset": 0}], [data])  # states saved again

    # resumed at GRID (the plan may pick any state it was told of): the rest rewritten
    lines = _recv(tmp_path, [{"path": rel, "offset": GRID, "state": True}], [data[GRID:]])
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data), "prefix_read": 0}
    assert (part / "model.bin").read_bytes() == data

    doc = json.loads(sidecar.read_text())
    doc["ino"] += 1  # the sidecar of a file since replaced
    sidecar.write_text(json.dumps(doc))
    assert "resume" not in scan_root(str(tmp_path))["partials"]["step_1"][0]
    lines = _recv(tmp_path, [{"path": rel, "offset": GRID, "state": True}], [data[GRID:]])
    assert lines[0] == {"i": 0, "sha256": want, "size": len(data), "prefix_read": GRID}

    doc = {
        "dev": os.stat(part / "model.bin").st_dev,
        "ino": os.stat(part / "model.bin").st_ino,
        "states": {str(GRID): Sha256().state().hex()},  # the state at 0, claimed at GRID
    }
    sidecar.write_text(json.dumps(doc))
    assert "resume" not in scan_root(str(tmp_path))["partials"]["step_1"][0]
    lines = _recv(tmp_path, [{"path": rel, "offset": GRID, "state": True}], [data[GRID:]])
    assert lines[0]["sha256"] == want and lines[0]["prefix_read"] == GRID

    from remote.relay.publish import publish_checkpoint

    manifest = {"files": [{"path": "model.bin", "size": len(data), "mtime": 1.0}]}
    publish_checkpoint(str(tmp_path), "step_1", "dir", manifest)
    assert sorted(p.name for p in (tmp_path / "step_1").iterdir()) == [
        ".dflash-manifest.json",
        "model.bin",
    ]


def test_a_symlinked_sidecar_is_neither_read_nor_written_through(tmp_path):
    """A link planted at a sidecar's name is not followed: the scan reports no resume,
    and the next receive replaces the link, leaving its target as it was."""
    part = tmp_path / ".partial-step_2"
    part.mkdir()
    (part / "w.bin").write_bytes(b"x" * 10)
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    (part / (states.SIDECAR_PREFIX + "w.bin")).symlink_to(target)
    assert "resume" not in scan_root(str(tmp_path))["partials"]["step_2"][0]
    _recv(tmp_path, [{"path": ".partial-step_2/w.bin", "offset": 0}], [b"y" * 100])
    assert target.read_text() == "keep"


def _state_at(offset: int) -> bytes:
    """A state that passes the checks at `offset` (the bit count patched in)."""
    import struct

    state = bytearray(Sha256().state())
    struct.pack_into("=II", state, 32, (offset * 8) & 0xFFFFFFFF, (offset * 8) >> 32)
    return bytes(state)


@needs_states
def test_source_cache_keeps_the_newest_states_and_a_bounded_number_of_files(tmp_path):
    """A send from 0 keeps its new states even when a previous send of the same bytes
    left states further on (kept by when they were recorded, not by offset); the cache
    holds at most CACHE_ENTRIES files."""
    path = tmp_path / "big.bin"
    with open(path, "wb") as fh:
        fh.truncate((states.CACHE_KEEP + 10) * GRID)  # sparse: only its identity matters
    fd = os.open(path, os.O_RDONLY)
    try:
        first = states.SourceStates.open(str(path), fd, str(tmp_path / "cache"))
        for k in range(1, states.CACHE_KEEP + 10):
            first.record(k * GRID, _state_at(k * GRID))
        first.close()
        again = states.SourceStates.open(str(path), fd, str(tmp_path / "cache"))
        for k in range(1, 4):
            again.record(k * GRID, _state_at(k * GRID))
        again.close()
        last = states.SourceStates.open(str(path), fd, str(tmp_path / "cache"))
        assert all(last.lookup(k * GRID) is not None for k in range(1, 4))
        assert last.lookup((states.CACHE_KEEP + 9) * GRID) is not None
        # the first send kept 10..CACHE_KEEP+9; the second's three pushed out the oldest
        assert last.lookup(12 * GRID) is None and last.lookup(13 * GRID) is not None
        last.close()
    finally:
        os.close(fd)
    cache = tmp_path / "cache"
    for n in range(states.CACHE_ENTRIES + 5):
        f = tmp_path / f"f{n}"
        f.write_bytes(b"")
        with open(f, "rb") as fh:
            entry = states.SourceStates.open(str(f), fh.fileno(), str(cache))
            entry.record(GRID, _state_at(GRID))
            entry.close()
    assert len(list(cache.iterdir())) == states.CACHE_ENTRIES
