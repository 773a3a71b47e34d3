"""The host-side hash of a resumed file (`remote.relay.host._Hasher`): a kept prefix read
from the file (with O_DIRECT where the filesystem takes it), then the new bytes, from
memory as far as its budget allows and read back from the file past that, always giving
the sha256 of the whole file."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from remote.relay.host import CHUNK, _Hasher

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
        hasher = _Hasher(fd, prefix, direct=direct, keep=keep)
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
        hasher = _Hasher(fd, MiB)
        with pytest.raises(OSError):
            hasher.result(2 * MiB)
    finally:
        os.close(fd)
