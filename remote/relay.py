"""Host-side halves of ``dflash relay``: scan, send, receive, hash, publish (stdlib only).

The controller never parses human output: `relay-scan`, `relay-hash` and `relay-publish`
print one JSON document; `relay-send` streams a file's bytes on stdout and prints its JSON
summary (sha256 of the WHOLE file, size) on stderr; `relay-recv` writes stdin into a file
and prints its JSON summary (sha256 of the whole resulting file, size) on stdout.

Hashing is done here, on the hosts, with Python's hashlib (OpenSSL: uses the CPU's SHA
instructions). coreutils ``sha256sum`` does not on common distributions and was 4-5x slower,
enough to halve the relay's throughput.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import time

from remote.errors import UserError

CHUNK = 4 * 1024 * 1024  # large reads/writes: small ones make the Python paths crawl
MANIFEST = ".dflash-manifest.json"
PARTIAL_PREFIX = ".partial-"


PIPE_SIZE = 1024 * 1024  # Linux's default pipe-max-size; 64 KiB pipes mean 64 KiB reads


def _widen_pipe(fd: int) -> None:
    """Grow a pipe's buffer so each read moves up to 1 MiB, not 64 KiB (Linux only)."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        pass  # not a pipe, or not allowed: smaller reads still work


class _Reader:
    """Reads `fd` in blocks of up to CHUNK bytes, filling a reused buffer: few, large
    Python-level operations per byte (hash updates, writes) however small the kernel's
    pieces are."""

    def __init__(self, fd: int):
        self.file = open(fd, "rb", buffering=0, closefd=False)
        self.buf = bytearray(CHUNK)
        self.view = memoryview(self.buf)

    def read(self, limit: int = CHUNK) -> memoryview:
        filled = 0
        limit = min(limit, CHUNK)
        while filled < limit:
            n = self.file.readinto(self.view[filled:limit])
            if not n:
                break
            filled += n
        return self.view[:filled]


class _Syncer:
    """fdatasync in a background thread every SYNC_EVERY bytes, so the final fsync has
    little left to flush and the stream never waits for the disk in one long stall."""

    SYNC_EVERY = 64 * 1024 * 1024

    def __init__(self, fd: int):
        import threading
        self.fd, self.pending = fd, 0
        self.wake = threading.Event()
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrote(self, n: int) -> None:
        self.pending += n
        if self.pending >= self.SYNC_EVERY:
            self.pending = 0
            self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.done:
                return
            try:
                os.fdatasync(self.fd)
            except OSError:
                return

    def finish(self) -> None:
        self.done = True
        self.wake.set()
        self.thread.join()
        os.fsync(self.fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _hash_prefix(fd: int, length: int, h) -> int:
    """Feed the first `length` bytes of `fd` (from its current offset) to `h`; bytes read."""
    done = 0
    while done < length:
        block = os.read(fd, min(CHUNK, length - done))
        if not block:
            break
        h.update(block)
        done += len(block)
    return done


# ---- scan -------------------------------------------------------------------------------

def _files_under(top: str) -> list[dict]:
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(full, top)
            if rel == MANIFEST or os.path.basename(rel).startswith(".dflash-"):
                continue
            out.append({"path": rel, "size": st.st_size, "mtime": st.st_mtime})
    return out


def _free_bytes(path: str) -> int:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def scan(args) -> int:
    """List checkpoints (files per checkpoint, sizes, mtimes), manifests, partials, free space."""
    root = args.root
    result = {"now": time.time(), "root": root, "exists": os.path.isdir(root),
              "free": _free_bytes(root), "entries": [], "partials": {}, "manifests": {}}
    if not result["exists"]:
        print(json.dumps(result))
        return 0
    for name in sorted(os.listdir(root)):
        full = os.path.join(root, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if name.startswith(PARTIAL_PREFIX) and stat.S_ISDIR(st.st_mode):
            result["partials"][name[len(PARTIAL_PREFIX):]] = _files_under(full)
            continue
        if name.startswith(".") and name.endswith(MANIFEST) and name != MANIFEST:
            # manifest of a single-file checkpoint: ".<name>.dflash-manifest.json"
            result["manifests"][name[1:-len(MANIFEST)]] = _read_json(full)
            continue
        if name.startswith("."):
            continue
        if stat.S_ISDIR(st.st_mode):
            entry = {"name": name, "kind": "dir", "files": _files_under(full)}
            manifest = os.path.join(full, MANIFEST)
            if os.path.isfile(manifest):
                result["manifests"][name] = _read_json(manifest)
        elif stat.S_ISREG(st.st_mode):
            entry = {"name": name, "kind": "file",
                     "files": [{"path": name, "size": st.st_size, "mtime": st.st_mtime}]}
        else:
            continue
        result["entries"].append(entry)
    print(json.dumps(result))
    return 0


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None  # unreadable manifest: treated as "not relayed", so it gets redone


# ---- send / receive ---------------------------------------------------------------------

def send(args) -> int:
    """Stream `path` from byte `offset` to stdout; hash the whole file while doing so."""
    try:
        fd = os.open(args.path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"cannot read {args.path}: {exc.strerror}") from None
    _widen_pipe(1)
    h = hashlib.sha256()
    size = _hash_prefix(fd, args.offset, h)  # the prefix is hashed, not sent
    reader = _Reader(fd)
    while True:
        block = reader.read()
        if not block:
            break
        h.update(block)
        _write_all(1, block)
        size += len(block)
    os.close(fd)
    sys.stderr.write(json.dumps({"sha256": h.hexdigest(), "size": size}) + "\n")
    return 0


def recv(args) -> int:
    """Write stdin into `path` after its first `offset` bytes (which are kept and hashed).

    With offset 0 the file is created or truncated. The summary covers the whole file, so
    a resumed file is checked end to end, not just its new tail. The data is fsynced so a
    published checkpoint survives a crash of the host.
    """
    os.makedirs(os.path.dirname(args.path) or ".", exist_ok=True)
    h = hashlib.sha256()
    fd = os.open(args.path, os.O_RDWR | os.O_CREAT, 0o644)
    # A writer from a dropped connection may still be draining its pipe into this file:
    # wait for it, so the truncate below cannot be overtaken by its late bytes.
    fcntl.flock(fd, fcntl.LOCK_EX)
    if not args.offset:
        os.ftruncate(fd, 0)
    if args.offset:
        got = _hash_prefix(fd, args.offset, h)
        if got != args.offset:
            raise UserError(f"{args.path} holds {got} bytes, fewer than the offset "
                            f"{args.offset}")
        os.ftruncate(fd, args.offset)
    size = args.offset
    _widen_pipe(0)
    reader = _Reader(0)
    syncer = _Syncer(fd)
    while True:
        block = reader.read()
        if not block:
            break
        h.update(block)
        _write_all(fd, block)
        size += len(block)
        syncer.wrote(len(block))
    syncer.finish()
    os.close(fd)
    print(json.dumps({"sha256": h.hexdigest(), "size": size}), flush=True)
    return 0


def hash_files(args) -> int:
    """sha256 of files or of their first `length` bytes; requests as a JSON list on stdin."""
    requests = json.load(sys.stdin)
    out = []
    for req in requests:
        path, length = req["path"], req.get("length")
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            out.append({"path": path, "error": exc.strerror})
            continue
        h = hashlib.sha256()
        n = _hash_prefix(fd, length if length is not None else 1 << 62, h)
        os.close(fd)
        out.append({"path": path, "length": n, "sha256": h.hexdigest(),
                    "complete": length is None or n == length})
    print(json.dumps(out))
    return 0


# ---- publish ----------------------------------------------------------------------------

def publish(args) -> int:
    """Publish a verified partial checkpoint with one rename; JSON manifest read on stdin.

    A folder checkpoint: the manifest goes inside the partial folder, which is then renamed
    to its final name. A single-file checkpoint: the manifest is written beside it as
    ``.<name>.dflash-manifest.json``, then the file is renamed into place. A checkpoint
    that already exists (the source changed) is moved aside first and removed after.
    """
    manifest = json.load(sys.stdin)
    root, name = args.root, args.name
    partial = os.path.join(root, PARTIAL_PREFIX + name)
    final = os.path.join(root, name)
    if not os.path.isdir(partial):
        raise UserError(f"nothing to publish: {partial} is missing")
    data = json.dumps(manifest, indent=2).encode()
    if args.kind == "dir":
        target = os.path.join(partial, MANIFEST)
    else:
        target = os.path.join(root, f".{name}{MANIFEST}")
    tmp = target + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    old = None
    if os.path.lexists(final):
        old = os.path.join(root, f".old-{name}-{os.getpid()}")
        os.rename(final, old)
    if args.kind == "dir":
        os.rename(partial, final)
    else:
        os.rename(os.path.join(partial, name), final)
        shutil.rmtree(partial, ignore_errors=True)
    _fsync_dir(root)
    if old:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)
    print(json.dumps({"published": final}))
    return 0


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def register(sub) -> None:
    p = sub.add_parser("relay-scan", help="list checkpoints, manifests, partials, free space")
    p.add_argument("root")
    p.set_defaults(func=scan)
    p = sub.add_parser("relay-send", help="stream a file to stdout, hash on stderr")
    p.add_argument("path")
    p.add_argument("--offset", type=int, default=0)
    p.set_defaults(func=send)
    p = sub.add_parser("relay-recv", help="write stdin into a file, hash on stdout")
    p.add_argument("path")
    p.add_argument("--offset", type=int, default=0)
    p.set_defaults(func=recv)
    p = sub.add_parser("relay-hash", help="sha256 of files or prefixes (JSON on stdin)")
    p.set_defaults(func=hash_files)
    p = sub.add_parser("relay-publish", help="publish a partial checkpoint by rename")
    p.add_argument("root")
    p.add_argument("name")
    p.add_argument("--kind", choices=("dir", "file"), required=True)
    p.set_defaults(func=publish)
