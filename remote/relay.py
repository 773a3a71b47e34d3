"""Host-side halves of ``dflash relay``: scan, send, receive, hash, publish (stdlib only).

The controller never parses human output: `relay-scan`, `relay-hash` and `relay-publish`
print one JSON document; `relay-send` streams several files as frames on stdout and prints
a JSON line per file (sha256 of the WHOLE file, size) on stderr; `relay-recv` writes the
frames into files and prints a JSON line per file (sha256 of the whole resulting file,
size) on stdout once that file is fsynced.

Hashing is done here, on the hosts, with Python's hashlib (OpenSSL: uses the CPU's SHA
instructions). coreutils ``sha256sum`` does not on common distributions and was 4-5x slower,
enough to halve the relay's throughput.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import shutil
import stat
import struct
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

    def __init__(self, fd: int, view: memoryview | None = None):
        self.file = open(fd, "rb", buffering=0, closefd=False)
        self.view = view if view is not None else memoryview(bytearray(CHUNK))

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
    """Makes received files durable in one background thread, overlapping the stream.

    While a file is written, `wrote` asks for an fdatasync every SYNC_EVERY bytes, so the
    final fsync has little left to flush and the stream never stalls on the disk at once.
    `file_done` queues the file's fsync and close; only after that fsync does the thread
    call the file's `on_durable` (which prints its summary), so a file the controller
    hears of is on disk before it publishes. The fsync of file i overlaps the receive of
    file i+1. Jobs run in order on one thread, so a datasync never meets a closed fd.
    """

    SYNC_EVERY = 64 * 1024 * 1024

    def __init__(self):
        import queue
        import threading
        self.jobs: "queue.Queue" = queue.Queue()
        self.pending = 0
        self.error: OSError | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrote(self, fd: int, n: int) -> None:
        self.pending += n
        if self.pending >= self.SYNC_EVERY:
            self.pending = 0
            self.jobs.put((fd, None))

    def file_done(self, fd: int, on_durable) -> None:
        self.pending = 0
        self.jobs.put((fd, on_durable))

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fd, on_durable = job
            try:
                if on_durable is None:
                    if self.error is None:
                        os.fdatasync(fd)
                    continue
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                on_durable()
            except OSError as exc:  # reported by `close`: the file gets no summary
                self.error = self.error or exc

    def close(self) -> None:
        """Wait until every queued file is fsynced (and announced)."""
        self.jobs.put(None)
        self.thread.join()


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data` to `fd` (os.write may take only part of it)."""
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
    print(json.dumps(scan_root(args.root)))
    return 0


def scan_root(root: str) -> dict:
    """The scan of `root` as printed by ``relay-scan`` (see `scan`)."""
    result = {"now": time.time(), "root": root, "exists": os.path.isdir(root),
              "free": _free_bytes(root), "entries": [], "partials": {}, "manifests": {}}
    if not result["exists"]:
        return result
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
    return result


LOCK = ".dflash-relay.lock"  # who holds the lock, while it is held


def hold_lock(args) -> int:
    """Take `root`'s relay lock, print its scan, and hold the lock until stdin closes.

    One relay at a time may write into a drafters folder: two would share the partial
    folders, and the slower one could publish a checkpoint whose files the faster one had
    already moved into place. The lock is an flock of the folder itself by this process,
    so it ends with the relay's connection (stdin at EOF, or this process killed) and is
    never left behind; ``.dflash-relay.lock`` beside it names the holder while it is held.
    A filesystem without flock gets no lock. Prints one JSON line: ``{"locked": true,
    "scan": {...}}`` (the `scan_root` of `root`, taken under the lock) or
    ``{"locked": false, "holder": {...}}`` when another relay still holds it after
    `wait` seconds.
    """
    root = args.root
    info = os.path.join(root, LOCK)
    try:
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise UserError(f"cannot use {root}: {exc.strerror}") from None
    deadline = time.monotonic() + args.wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                print(json.dumps({"locked": False, "holder": _read_json(info) or {}}), flush=True)
                return 0
            time.sleep(0.1)
        except OSError:
            break  # no flock here (some network filesystems): go on unguarded
    try:
        with open(info, "w") as fh:
            json.dump({"by": args.by, "pid": os.getpid(), "since": time.time()}, fh)
        print(json.dumps({"locked": True, "scan": scan_root(root)}), flush=True)
        while os.read(0, 65536):
            pass
    finally:
        try:
            os.unlink(info)
        except OSError:
            pass
    return 0


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None  # unreadable manifest: treated as "not relayed", so it gets redone


# ---- send / receive ---------------------------------------------------------------------

# A frame: 8-byte big-endian length, then that many bytes. Both ends of the relay and the
# controller's pump (orchestrator.relay_stream) use these definitions.
HEADER = struct.Struct(">Q")


def read_exact(fd: int, n: int) -> bytes:
    """Exactly `n` bytes from `fd`, fewer only at end of stream."""
    out = b""
    while len(out) < n:
        block = os.read(fd, n - len(out))
        if not block:
            break
        out += block
    return out


def _emit(stream, record: dict) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()  # the controller may be waiting on this line


def send(args) -> int:
    """Stream several files, one frame each, to stdout; hash every whole file.

    The request is a JSON list on stdin: ``[{"path": P, "offset": N}, ...]``. For each
    file, in order, the first N bytes are hashed (not sent), then one frame carries the rest:
    its length (the size when opened, minus N) and the bytes. One process and one ssh channel
    for a whole checkpoint: per file we measured ~0.25 s of process and channel start-up,
    which made an 8-file checkpoint half as fast as one file of the same size. After each
    file a JSON line on stderr gives its index, sha256 and size; a file that cannot be read
    ends the stream (the files before it stand).
    """
    requests = json.load(sys.stdin)
    _widen_pipe(1)
    buf = memoryview(bytearray(CHUNK))  # one buffer for every file
    for i, req in enumerate(requests):
        path, offset = req["path"], int(req.get("offset") or 0)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            h = hashlib.sha256()
            if _hash_prefix(fd, offset, h) != offset:
                raise UserError(f"{path} holds fewer than {offset} bytes")
            left = size - offset
            write_all(1, HEADER.pack(left))
            reader = _Reader(fd, buf)
            while left:
                block = reader.read(left)
                if not block:  # shrank while read: the frame cannot be completed
                    raise UserError(f"{path} shrank while it was read")
                h.update(block)
                write_all(1, block)
                left -= len(block)
        finally:
            os.close(fd)
        sys.stderr.write(json.dumps({"i": i, "sha256": h.hexdigest(), "size": size}) + "\n")
    return 0


def recv(args) -> int:
    """Write the frames on stdin into files; print each file's summary once it is durable.

    stdin starts with a frame holding the JSON request ``[{"path": P, "offset": N}, ...]``,
    then one frame per file in that order. With offset 0 a file is created or truncated;
    otherwise its first N bytes are kept and hashed, and the frame appended after them, so a
    resumed file is checked end to end, not just its new tail. A file's JSON line on stdout
    (index, sha256 and size of the whole file) comes only after its fsync, so the controller
    publishes nothing that a crash of the host could lose.
    """
    _widen_pipe(0)
    head = read_exact(0, HEADER.size)
    if len(head) < HEADER.size:
        raise UserError("no request on stdin")
    requests = json.loads(read_exact(0, HEADER.unpack(head)[0]))
    syncer = _Syncer()
    # Page-aligned buffer (anonymous mmap): O_DIRECT writes need aligned addresses.
    reader = _Reader(0, memoryview(mmap.mmap(-1, CHUNK)))
    try:
        for i, req in enumerate(requests):
            head = read_exact(0, HEADER.size)
            if len(head) < HEADER.size:
                raise UserError(f"the stream ended after {i} of {len(requests)} files")
            left = HEADER.unpack(head)[0]
            fd, h, size = _open_for_write(req["path"], int(req.get("offset") or 0))
            out = _Writer(fd, req["path"], size)
            try:
                while left:
                    # until the file offset is aligned, read only up to the boundary
                    block = reader.read(min(left, out.to_boundary() or CHUNK))
                    if not block:
                        raise UserError(f"the stream ended inside {req['path']}")
                    h.update(block)
                    syncer.wrote(fd, out.write(block))
                    size += len(block)
                    left -= len(block)
            except BaseException:
                out.close()
                os.close(fd)  # a partial file stays for the next relay to resume
                raise
            out.close()
            record = {"i": i, "sha256": h.hexdigest(), "size": size}
            syncer.file_done(fd, lambda r=record: _emit(sys.stdout, r))
    finally:
        syncer.close()
    if syncer.error is not None:
        raise UserError(f"cannot write to disk: {syncer.error.strerror or syncer.error}")
    return 0


ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffer addresses aligned to blocks


class _Writer:
    """Writes a file from `pos` on, whole aligned blocks with O_DIRECT, the rest buffered.

    Measured on the 2-core test box (1 GiB, dd): buffered writes plus fdatasync took 3.1 s
    and 2.6 s of kernel CPU, O_DIRECT 0.6 s and 0.1 s. Copying into the page cache and
    writing it back was the receiving host's largest CPU cost, taken from the ssh and
    hashing processes sharing its cores. Direct writes reach the device at once; the
    fsync that follows each file still flushes the device's cache and the metadata, so
    durability is unchanged. A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6,
    some network and FUSE filesystems) gets buffered writes, and so does a host whose
    environment sets ``DFLASH_RELAY_BUFFERED=1`` (for a filesystem where direct I/O is
    accepted but slow).
    """

    def __init__(self, fd: int, path: str, pos: int):
        self.fd, self.pos, self.direct = fd, pos, None
        if hasattr(os, "O_DIRECT") and os.environ.get("DFLASH_RELAY_BUFFERED") != "1":
            try:
                self.direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError:
                pass  # not supported here: buffered writes only

    def to_boundary(self) -> int:
        """Bytes left to the next aligned offset (0 when aligned or not direct)."""
        return (-self.pos) % ALIGN if self.direct is not None else 0

    def write(self, block: memoryview) -> int:
        """Write `block` (starting at an aligned address) at the current offset; returns the
        bytes that went through the page cache (for the syncer)."""
        n = len(block) - len(block) % ALIGN if self.direct is not None and \
            self.pos % ALIGN == 0 else 0
        if n:
            try:
                _pwrite_all(self.direct, block[:n], self.pos)
            except OSError as exc:
                if exc.errno != 22:  # EINVAL: alignment this filesystem refuses
                    raise
                self.close()
                n = 0
        if n < len(block):
            _pwrite_all(self.fd, block[n:], self.pos + n)
        self.pos += len(block)
        return len(block) - n

    def close(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        n = os.pwrite(fd, data, pos)
        data, pos = data[n:], pos + n


def _open_for_write(path: str, offset: int):
    """(fd, sha256 of the kept prefix, its size): `path` opened to append after `offset`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    # A writer from a dropped connection may still be draining its pipe into this file:
    # wait for it, so the truncate below cannot be overtaken by its late bytes.
    fcntl.flock(fd, fcntl.LOCK_EX)
    if offset:
        got = _hash_prefix(fd, offset, h)
        if got != offset:
            os.close(fd)
            raise UserError(f"{path} holds {got} bytes, fewer than the offset {offset}")
    os.ftruncate(fd, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return fd, h, offset


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
    # The last guard of "never half a checkpoint": every file of the manifest is there at
    # its full size, whatever happened to the partial folder since it was verified.
    for f in manifest.get("files", []):
        try:
            size = os.path.getsize(os.path.join(partial, f["path"]))
        except OSError:
            size = None
        if size != f["size"]:
            raise UserError(f"{name} is not published: {f['path']} holds "
                            f"{'nothing' if size is None else f'{size} bytes'} in {partial}, "
                            f"not {f['size']}; run the relay again")
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
    p = sub.add_parser("relay-lock", help="hold the relay lock of a folder until stdin closes")
    p.add_argument("root")
    p.add_argument("--by", default="", help="who holds it, for the message another relay shows")
    p.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the lock")
    p.set_defaults(func=hold_lock)
    p = sub.add_parser("relay-send", help="stream files (JSON list on stdin) as frames")
    p.set_defaults(func=send)
    p = sub.add_parser("relay-recv", help="write frames on stdin into files")
    p.set_defaults(func=recv)
    p = sub.add_parser("relay-hash", help="sha256 of files or prefixes (JSON on stdin)")
    p.set_defaults(func=hash_files)
    p = sub.add_parser("relay-publish", help="publish a partial checkpoint by rename")
    p.add_argument("root")
    p.add_argument("name")
    p.add_argument("--kind", choices=("dir", "file"), required=True)
    p.set_defaults(func=publish)
