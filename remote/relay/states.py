"""Saved sha256 states of relayed files: the destination's sidecar, the source's cache
(docs/relay.md, "Resume"). Writes follow no symlink, need no fsync: a torn file is refused."""

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
SIDECAR_KEEP = 2
CACHE_KEEP = 64  # the destination's durable state lags
CACHE_ENTRIES = 128
MAX_BYTES = 64 * 1024


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
    """Replace `name` in `dir_fd`; the temp name carries the pid: sources may share a cache."""
    write_new(
        dir_fd,
        name,
        json.dumps(doc).encode(),
        tmp=f"{name}.{os.getpid()}.tmp",
        mode=0o600,
        fsync=False,
    )


def _states(doc: dict, limit: int) -> dict[int, bytes]:
    """The valid states of a document, within `limit`."""
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
    return {str(k): v.hex() for k, v in list(states.items())[-keep:]}


def sidecar_name(leaf: str) -> str:
    return SIDECAR_PREFIX + leaf


def read_sidecar(dir_fd: int, leaf: str, st: os.stat_result) -> dict[int, bytes]:
    """The valid states of partial file `leaf`, whose device and inode the sidecar names."""
    doc = _read(dir_fd, sidecar_name(leaf))
    if doc is None or doc.get("dev") != st.st_dev or doc.get("ino") != st.st_ino:
        return {}
    return _states(doc, st.st_size)


def write_sidecar(dir_fd: int, leaf: str, st: os.stat_result, states: dict[int, bytes]) -> None:
    if not states:
        remove_sidecar(dir_fd, leaf)
        return
    newest = {k: states[k] for k in sorted(states)}
    doc = {"dev": st.st_dev, "ino": st.st_ino, "states": _encode(newest, SIDECAR_KEEP)}
    _write(dir_fd, sidecar_name(leaf), doc)


def remove_sidecar(dir_fd: int, leaf: str) -> None:
    try:
        os.unlink(sidecar_name(leaf), dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def remove_sidecars(top_fd: int) -> None:
    """Remove every sidecar under `top_fd` (a partial folder about to be published)."""
    for _, _, files, dfd in os.fwalk(".", dir_fd=top_fd):
        for name in files:
            if name.startswith(SIDECAR_PREFIX):
                try:
                    os.unlink(name, dir_fd=dfd)
                except OSError:
                    pass


def mark_resumable(folder: str, files: list[dict]) -> None:
    """Add ``"resume"`` (the largest offset with a valid state) to each partial file."""
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


def cache_dir() -> str | None:
    """Where the source keeps states (``DFLASH_RELAY_STATES``, else the workdir's), or None."""
    env = os.environ.get("DFLASH_RELAY_STATES")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(sys.argv[0] or "."))
    if os.path.basename(here) == "bundles":
        return os.path.join(os.path.dirname(here), "relay-states")
    return None


class SourceStates:
    """The cached states of one source file, bound to its real path and identity."""

    def __init__(self, dir_fd: int, key: str, identity: list):
        self.dir_fd, self.name, self.identity = dir_fd, key + ".json", identity
        self.states: dict[int, bytes] | None = None

    @classmethod
    def open(cls, path: str, fd: int, folder: str | None = None) -> SourceStates | None:
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
        state = self._load().get(offset)
        return None if state is None else Sha256.resume(state, offset)

    def record(self, offset: int, state: bytes) -> None:
        states = self._load()
        first = not states
        # In the order recorded: a send from 0 keeps its states over an earlier send's.
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
        entries, stale = [], time.time_ns() - 3600 * 10**9
        for name in os.listdir(self.dir_fd):
            if name.endswith(".tmp"):  # left by a killed writer
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
