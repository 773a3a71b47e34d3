"""Saved sha256 states of files being relayed, so a resume hashes no kept prefix again.

Both hosts record a file's hash state (`sha256state`) every `GRID` bytes while it moves:

- the destination in a *sidecar* beside the partial file, ``.dflash-states-<name>``
  (hidden from scans and removed at publication), written only once the bytes up to that
  offset are durable (fdatasync), bound to the partial file's device and inode. Its scan
  reports the largest offset with a valid state as the file's ``resume``;
- the source in a cache in its own workdir (``<workdir>/relay-states/``), one entry per
  file, keyed by its real path and bound to its identity (device, inode, size, mtime and
  ctime in ns): a file changed since matches no entry.

A resume at such an offset continues both hashes from their states. Every state is
checked when read (its offset on the grid and within the file, the struct's own bit
count, the file's identity); anything else is ignored and that side hashes the prefix from
disk as before. The relay still compares the two whole-file digests, so a wrong state
shows up as a mismatch (the file is sent again from 0), never as a published file whose
bytes differ from the source's digest. What a state cannot see is a kept prefix changed in
place on the destination after it was written: the partial folder is trusted to hold what
the relay wrote, as published files are trusted by size and mtime; ``--verify`` ignores
destination states and hashes every kept prefix again.

Writes never follow symlinks (O_NOFOLLOW | O_EXCL temp file, then a rename) and need no
fsync: a lost or torn state file is refused when read, which only costs a prefix hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time

from remote.relay.fdfiles import write_new
from remote.relay.sha256state import GRID, Sha256, state_problem

SIDECAR_PREFIX = ".dflash-states-"
SIDECAR_KEEP = 2  # states per destination file (the newest; the partial only grows)
CACHE_KEEP = 64  # states per source file, the newest: the destination's durable one lags
CACHE_ENTRIES = 128  # source files with states; the least recently written are dropped
MAX_BYTES = 64 * 1024  # a state file larger than this is not one of ours


def _read(dir_fd: int, name: str) -> dict | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _write(dir_fd: int, name: str, doc: dict) -> None:
    """Replace `name` in `dir_fd` (module docstring: no symlink followed, no fsync); errors
    are the caller's. The temp name carries the pid: two sources may share a cache."""
    write_new(
        dir_fd,
        name,
        json.dumps(doc).encode(),
        tmp=f"{name}.{os.getpid()}.tmp",
        mode=0o600,
        fsync=False,
    )


def _states(doc: dict, limit: int) -> dict[int, bytes]:
    """The valid states of a document: offset on the grid, 0 < offset <= limit, and the
    struct's bit count agreeing with the offset."""
    out: dict[int, bytes] = {}
    raw = doc.get("states")
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        try:
            offset, state = int(key), bytes.fromhex(value)
        except (TypeError, ValueError):
            continue
        if 0 < offset <= limit and offset % GRID == 0 and state_problem(state, offset) is None:
            out[offset] = state
    return out


def _encode(states: dict[int, bytes], keep: int) -> dict[str, str]:
    """The last `keep` states in the dict's order (the order they were recorded in)."""
    return {str(k): v.hex() for k, v in list(states.items())[-keep:]}


# ---- destination: a sidecar beside the partial file ---------------------------------------


def sidecar_name(leaf: str) -> str:
    return SIDECAR_PREFIX + leaf


def read_sidecar(dir_fd: int, leaf: str, st: os.stat_result) -> dict[int, bytes]:
    """The valid states of partial file `leaf` in `dir_fd`, whose stat is `st`: the
    sidecar must name its device and inode, and each offset lie within its size."""
    doc = _read(dir_fd, sidecar_name(leaf))
    if doc is None or doc.get("dev") != st.st_dev or doc.get("ino") != st.st_ino:
        return {}
    return _states(doc, st.st_size)


def write_sidecar(dir_fd: int, leaf: str, st: os.stat_result, states: dict[int, bytes]) -> None:
    """Record `states` (the newest SIDECAR_KEEP) for partial file `leaf`; none: remove it."""
    if not states:
        remove_sidecar(dir_fd, leaf)
        return
    newest = {k: states[k] for k in sorted(states)}  # the partial only grows
    doc = {"dev": st.st_dev, "ino": st.st_ino, "states": _encode(newest, SIDECAR_KEEP)}
    _write(dir_fd, sidecar_name(leaf), doc)


def remove_sidecar(dir_fd: int, leaf: str) -> None:
    try:
        os.unlink(sidecar_name(leaf), dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def remove_sidecars(top_fd: int) -> None:
    """Remove every sidecar under the folder open as `top_fd` (a partial folder about to
    be published); symlinked folders are not entered."""
    for _, _, files, dfd in os.fwalk(".", dir_fd=top_fd):
        for name in files:
            if name.startswith(SIDECAR_PREFIX):
                try:
                    os.unlink(name, dir_fd=dfd)
                except OSError:
                    pass


def mark_resumable(folder: str, files: list[dict]) -> None:
    """Add ``"resume": offset`` to each scanned partial file (path relative to `folder`)
    whose sidecar holds a valid state: the largest such offset."""
    for f in files:
        if f.get("link"):
            continue
        head, leaf = os.path.split(os.path.join(folder, f["path"]))
        try:
            dfd = os.open(head, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
            states = read_sidecar(dfd, leaf, st) if stat.S_ISREG(st.st_mode) else {}
        except OSError:
            states = {}
        finally:
            os.close(dfd)
        if states:
            f["resume"] = max(states)


# ---- source: a cache in the host's workdir ---------------------------------------------------


def cache_dir() -> str | None:
    """Where the source keeps states: ``DFLASH_RELAY_STATES``, else ``relay-states`` in
    the workdir whose ``bundles/`` holds the running bundle; None (no cache) otherwise."""
    env = os.environ.get("DFLASH_RELAY_STATES")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(sys.argv[0] or "."))
    if os.path.basename(here) == "bundles":
        return os.path.join(os.path.dirname(here), "relay-states")
    return None


class SourceStates:
    """The cached states of one source file open as `fd` (see the module docstring)."""

    def __init__(self, dir_fd: int, key: str, identity: list):
        self.dir_fd, self.name, self.identity = dir_fd, key + ".json", identity
        self.states: dict[int, bytes] | None = None  # loaded on first use

    @classmethod
    def open(cls, path: str, fd: int, folder: str | None = None) -> SourceStates | None:
        """The cache entry of `path` (open as `fd`), or None where there is no cache."""
        folder = folder or cache_dir()
        if folder is None:
            return None
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            st = os.fstat(fd)
        except OSError:
            return None
        real = os.path.realpath(path)
        identity = [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        key = hashlib.sha256(real.encode(errors="surrogateescape")).hexdigest()
        return cls(dir_fd, key, identity)

    def _load(self) -> dict[int, bytes]:
        if self.states is None:
            doc = _read(self.dir_fd, self.name)
            ok = doc is not None and doc.get("identity") == self.identity
            self.states = _states(doc, self.identity[3]) if ok else {}
        return self.states

    def lookup(self, offset: int) -> Sha256 | None:
        """The hash after the file's first `offset` bytes, if this entry holds it."""
        state = self._load().get(offset)
        return None if state is None else Sha256.resume(state, offset)

    def record(self, offset: int, state: bytes) -> None:
        """Add the state at `offset`; a cache that cannot be written is skipped."""
        states = self._load()
        first = not states
        # Kept in the order recorded, not by offset: a send from 0 must not lose its new
        # states to those a previous send of the same bytes left further on.
        states.pop(offset, None)
        states[offset] = state
        for old in list(states)[:-CACHE_KEEP]:
            del states[old]
        try:
            doc = {"identity": self.identity, "states": _encode(states, CACHE_KEEP)}
            _write(self.dir_fd, self.name, doc)
            if first:
                self._prune()
        except OSError:
            pass

    def _prune(self) -> None:
        """Keep at most CACHE_ENTRIES entries: the least recently written go."""
        entries, stale = [], time.time_ns() - 3600 * 10**9
        for name in os.listdir(self.dir_fd):
            if name.endswith(".tmp"):  # left by a writer killed before its rename
                try:
                    if os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_mtime_ns < stale:
                        os.unlink(name, dir_fd=self.dir_fd)
                except OSError:
                    pass
            elif name.endswith(".json"):
                try:
                    st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                entries.append((st.st_mtime_ns, name))
        for _, name in sorted(entries)[:-CACHE_ENTRIES]:
            try:
                os.unlink(name, dir_fd=self.dir_fd)
            except OSError:
                pass

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1
