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

import errno
import fcntl
import functools
import hashlib
import json
import mmap
import os
import shutil
import signal
import stat
import sys
import time

from remote.errors import UserError
from remote.relay import sha256state, states
from remote.relay.fdfiles import write_all, write_new
from remote.relay.sha256state import GRID
from remote.relay.wire import (
    FRAME_HEADER,
    MANIFEST,
    PARTIAL_PREFIX,
    PATIENCE,
    REPAIR_PREFIX,
    name_problem,
    path_problem,
    read_exact,
    unbounded,
)

CHUNK = 4 * 1024 * 1024  # large reads/writes: small ones make the Python paths crawl


PIPE_SIZE = 1024 * 1024  # Linux's default pipe-max-size; 64 KiB pipes mean 64 KiB reads


def _widen_pipe(fd: int) -> None:
    """Grow a pipe's buffer so each read moves up to 1 MiB, not 64 KiB (Linux only)."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        pass  # not a pipe, or not allowed: smaller reads still work


def _fill(fd: int, view: memoryview, call=unbounded) -> int:
    """Read from `fd` until `view` is full or the stream ends; bytes read. One large block
    per Python-level operation (hash update, write), however small the kernel's pieces.
    `call` makes each read (`remote.relay.patience`: with a deadline)."""
    filled = 0
    while filled < len(view):
        n = call(os.readv, fd, [view[filled:]])
        if not n:
            break
        filled += n
    return filled


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

        self.jobs: queue.Queue = queue.Queue()
        self.pending = 0
        self.error: tuple[OSError, str] | None = None  # (error, file)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wrote(self, fd: int, n: int, label: str = "") -> None:
        self.pending += n
        if self.pending >= self.SYNC_EVERY:
            self.pending = 0
            self.jobs.put((fd, (None, label, None)))

    def durable(self, fd: int, then) -> None:
        """Queue an fdatasync of `fd`, then `then()` once it succeeded (a hash state is
        recorded only for bytes that are on disk)."""
        self.pending = 0
        self.jobs.put((fd, (None, "", then)))

    def settle(self) -> None:
        """Wait until every job queued so far has run (before a failed file's fd closes:
        no queued datasync may meet that number reused)."""
        import threading

        done = threading.Event()
        self.jobs.put((-1, (None, "", done.set)))
        while not done.wait(0.1) and self.thread.is_alive():
            pass

    def file_done(self, fd: int, on_durable, label: str = "", before=None) -> None:
        """Queue the file's fsync and close, then `on_durable`; `before` (finishing a
        resumed file's hash, which still reads `fd`) runs first, here, so the receive
        of the next file does not wait for it."""
        self.pending = 0
        self.jobs.put((fd, (on_durable, label, before)))

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fd, (done, label, before) = job
            try:
                if done is None:
                    if fd < 0:
                        before()  # `settle`
                    elif self.error is None:
                        os.fdatasync(fd)
                        if before is not None:
                            before()
                    continue
                try:
                    if before is not None:
                        before()
                    os.fsync(fd)
                finally:
                    os.close(fd)
                done()
            except OSError as exc:  # reported by `close`: the file gets no summary
                self.error = self.error or (exc, label)

    def close(self) -> None:
        """Wait until every queued file is fsynced (and announced)."""
        self.jobs.put(None)
        self.thread.join()


class _Hasher:
    """sha256 of a file from offset 0, computed in a thread, so hashing overlaps with the
    stream instead of delaying it.

    The thread hashes bytes ``[0, limit)``; the owner raises `limit` as more of the file
    becomes valid (a receiver after each write), then calls `result(size)`: the thread
    hashes up to `size` and the sha256 of the first `size` bytes is returned (the error
    the thread met, if any, is raised).

    The sender hashes every file this way, reading from the page cache while ``sendfile``
    moves the same pages into the stream (`_send_file`); a resumed file is hashed once,
    whole, on each host. The receiver of a resumed file reads the kept prefix with
    O_DIRECT (`direct`): it was written with O_DIRECT, so it is not cached, and a cold
    buffered read costs about ten times the kernel CPU (page cache fill and copy). The
    bytes that arrive meanwhile are handed over in memory (`advance` with a piece, up to
    `keep` bytes queued): the thread hashes them from there once it gets to them, and
    reads from the disk only what did not fit.

    Resumes at an offset whose hash state both hosts saved (`states`) skip this class: it
    is the fallback that reads the kept prefix again.
    """

    prefix_read: int | None = None  # the sender's: bytes of a kept prefix hashed again

    def __init__(self, fd: int, limit: int, direct: bool = False, keep: int = 0):
        import collections
        import threading

        self.fd, self.limit, self.pos, self.keep = fd, limit, 0, keep
        self.direct = _reopen_direct(fd) if direct else None
        self.pieces: collections.deque = collections.deque()  # (offset, bytes), in order
        self.queued = 0  # bytes in `pieces`
        self.h = hashlib.sha256()
        self.error: BaseException | None = None
        self.final: int | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def advance(self, limit: int, piece: memoryview | None = None) -> None:
        """Bytes up to `limit` are valid now; `piece`, when given, holds the last of them
        (a copy is queued if `keep` allows, else the thread reads them from the file)."""
        with self.cond:
            if piece is not None and self.queued + len(piece) <= self.keep:
                start = limit - len(piece)
                if start >= self.pos:
                    self.pieces.append((start, bytes(piece)))
                    self.queued += len(piece)
            self.limit = limit
            self.cond.notify()

    def _next(self) -> tuple[int, bytes | None]:
        """(bytes to read from the file, or 0; the queued piece to hash instead, or None)
        for the thread's position, waiting until there is something; (0, None): done."""
        with self.cond:
            while self.pos >= self.limit and self.final is None:
                self.cond.wait()
            end = self.limit if self.final is None else self.final
            if self.pos >= end:
                return 0, None
            while self.pieces and self.pieces[0][0] + len(self.pieces[0][1]) <= self.pos:
                self.queued -= len(self.pieces.popleft()[1])  # passed by a read
            if self.pieces and self.pieces[0][0] <= self.pos:
                start, data = self.pieces.popleft()
                self.queued -= len(data)
                return 0, data[self.pos - start : end - start]
            stop = min(end, self.pieces[0][0]) if self.pieces else end
            return min(CHUNK, stop - self.pos), None

    def _run(self) -> None:
        """Read (or take from the queue) and hash. With O_DIRECT the hash runs in a second
        thread, so that a read from the disk (O_DIRECT reads get no read-ahead) overlaps
        the previous block's hash; page-cache reads have the kernel's read-ahead, and one
        thread (no hand-overs between threads) does. `pos` counts the bytes handed to
        the hash."""
        import queue
        import threading

        pipelined = self.direct is not None
        free: queue.Queue = queue.Queue()
        for _ in range(2 if pipelined else 1):
            free.put(memoryview(mmap.mmap(-1, CHUNK)))  # page-aligned, as O_DIRECT needs
        todo: queue.Queue = queue.Queue()

        def consume(item: tuple) -> None:
            data, buf = item
            self.h.update(data)
            if buf is not None:
                free.put(buf)

        def hash_blocks() -> None:
            for item in iter(todo.get, None):
                consume(item)

        hand = todo.put if pipelined else consume
        hashing = threading.Thread(target=hash_blocks, daemon=True)
        if pipelined:
            hashing.start()
        try:
            while True:
                want, data = self._next()
                if data is not None:
                    hand((data, None))
                    self.pos += len(data)
                    continue
                if not want:
                    return
                buf = free.get()
                n = self._read(buf, want)
                if not n:
                    raise OSError(errno.EIO, "the file shrank while it was hashed")
                hand((buf[:n], buf))
                self.pos += n
        except BaseException as exc:  # raised by `result`
            self.error = exc
        finally:
            if pipelined:
                todo.put(None)
                hashing.join()
            if self.direct is not None:
                os.close(self.direct)
                self.direct = None

    def _read(self, buf: memoryview, want: int) -> int:
        """Read up to `want` bytes at the thread's position: whole aligned blocks by
        O_DIRECT when it is on, the rest (a tail, or everything) through the page cache."""
        aligned = want - want % ALIGN
        if self.direct is not None and aligned and self.pos % ALIGN == 0:
            try:
                return os.preadv(self.direct, [buf[:aligned]], self.pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.direct)  # refused here: buffered reads from now on
                self.direct = None
        return os.preadv(self.fd, [buf[:want]], self.pos)

    def done(self, size: int) -> bool:
        """Whether `result(size)` would answer at once (hashed that far, or failed)."""
        return self.pos >= size or not self.thread.is_alive()

    def wait(self, pos: int, start: int = 0) -> None:
        """Wait until the thread has hashed up to `pos` (or ended); with `start`, only
        once it has passed `start` (a sender's stream starts there)."""
        while self.pos < pos and pos > start and self.thread.is_alive():
            self.thread.join(0.005)

    def stop(self) -> None:
        """End the thread without a result (the file failed): nothing reads `fd` after."""
        with self.cond:
            self.final = 0
            self.cond.notify()
        self.thread.join()

    def result(self, size: int) -> str:
        with self.cond:
            self.final = size
            self.cond.notify()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.h.hexdigest()


def _direct_flag() -> int:
    """O_DIRECT where this host has it and ``DFLASH_RELAY_BUFFERED=1`` does not turn direct
    I/O off (see `_Writer`), else 0: the one switch for the receiver's writes and reads."""
    if os.environ.get("DFLASH_RELAY_BUFFERED") == "1":
        return 0
    return getattr(os, "O_DIRECT", 0)


def _reopen_direct(fd: int) -> int | None:
    """A second, O_DIRECT read descriptor of the file open as `fd` (Linux: through
    /proc/self/fd, which names that very file, not a path that could have changed), or
    None where that is not possible."""
    flag = _direct_flag()
    if not flag:
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | flag)
    except OSError:
        return None


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


# ---- paths ------------------------------------------------------------------------------


def shown(name: str) -> str:
    """A name with line breaks, as a scan shows it: ``\\n`` and ``\\r`` for them (no path
    may hold one, `path_problem`, so such an entry is shown, and refused, by this name)."""
    return name.replace("\n", "\\n").replace("\r", "\\r")


# ---- scan -------------------------------------------------------------------------------


def _files_under(top: str) -> tuple[list[dict], list[dict]]:
    """(files, what cannot be relayed) under `top`, paths relative to it.

    A symlink that resolves to a regular file is listed with that file's size and mtime
    and ``"link": true``: its content is what gets relayed (the Hugging Face cache
    layout links weight files to blobs outside the snapshot folder). A link that points
    to nothing, to a folder or to something else is listed in the second list with why
    (``{"path", "why", "link"}``, link: whether the entry is itself a symlink), so the
    controller can refuse the checkpoint instead of publishing it without it; so is an
    entry whose name holds a line break (no path may: see `path_problem`), by its
    `shown` name. Reading through
    a link is safe for the relay: the bytes land under the LINK's own name, inside the
    destination's folder, and a link can only expose what the trainer's user could have
    copied into the checkpoint folder anyway.
    """
    out, odd = [], []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in list(dirnames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full):  # os.walk does not enter it
                rel = shown(os.path.relpath(full, top))
                odd.append({"path": rel, "why": "points to a folder", "link": True})
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, top)
            if rel == MANIFEST or name.startswith(".dflash-"):
                continue
            if "\n" in rel or "\r" in rel:  # could not be named on a line: refused by name
                why = "has a line break in its name"
                odd.append({"path": shown(rel), "why": why, "link": os.path.islink(full)})
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            link = stat.S_ISLNK(st.st_mode)
            if link:
                try:
                    st = os.stat(full)
                except OSError:
                    odd.append({"path": rel, "why": "points to nothing", "link": True})
                    continue
            if not stat.S_ISREG(st.st_mode):
                if link:
                    why = "does not point to a regular file"
                    odd.append({"path": rel, "why": why, "link": True})
                continue
            entry = {"path": rel, "size": st.st_size, "mtime": st.st_mtime}
            if link:
                entry["link"] = True
            out.append(entry)
    return out, odd


def _free_bytes(path: str) -> int:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def _kind(path: str) -> str | None:
    """ "dir" or "file" for what `path` is (through a link), None for anything else."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None


def scan(args) -> int:
    """List checkpoints (files per checkpoint, sizes, mtimes), manifests, partials, free
    space, and the entries no line can name (``unnamed``: their `shown` name and kind,
    for the controller to show as refused)."""
    print(json.dumps(scan_root(args.root)))
    return 0


def scan_root(root: str) -> dict:
    """The scan of `root` as printed by ``relay-scan`` (see `scan`)."""
    result = {
        "now": time.time(),
        "root": root,
        "exists": os.path.isdir(root),
        "free": _free_bytes(root),
        "entries": [],
        "partials": {},
        "manifests": {},
    }
    if not result["exists"]:
        return result
    for name in sorted(os.listdir(root)):
        full = os.path.join(root, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if "\n" in name or "\r" in name:  # no line can carry it: shown, and refused
            kind = _kind(full)
            if kind is not None and not name.startswith("."):
                result.setdefault("unnamed", []).append({"name": shown(name), "kind": kind})
            continue
        if name.startswith(PARTIAL_PREFIX) and stat.S_ISDIR(st.st_mode) and name != PARTIAL_PREFIX:
            files, odd = _files_under(full)
            states.mark_resumable(full, files)  # "resume": where a saved hash state is
            result["partials"][name[len(PARTIAL_PREFIX) :]] = files
            if odd:
                result.setdefault("partial_odd", {})[name[len(PARTIAL_PREFIX) :]] = odd
            continue
        if name.startswith(".") and name.endswith(MANIFEST) and name != MANIFEST:
            # manifest of a single-file checkpoint: ".<name>.dflash-manifest.json"
            result["manifests"][name[1 : -len(MANIFEST)]] = _read_json(full)
            continue
        if name.startswith("."):
            continue
        if stat.S_ISLNK(st.st_mode):  # a checkpoint that is itself a link: its target
            try:
                st = os.stat(full)
            except OSError:
                continue
        if stat.S_ISDIR(st.st_mode):
            files, odd = _files_under(full)
            entry = {"name": name, "kind": "dir", "files": files}
            if odd:
                entry["odd"] = odd
            manifest = os.path.join(full, MANIFEST)
            if os.path.isfile(manifest):
                result["manifests"][name] = _read_json(manifest)
        elif stat.S_ISREG(st.st_mode):
            entry = {
                "name": name,
                "kind": "file",
                "files": [{"path": name, "size": st.st_size, "mtime": st.st_mtime}],
            }
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
    if not _flock_within(fd, args.wait):
        print(json.dumps({"locked": False, "holder": _read_json(info) or {}}), flush=True)
        return 0
    try:
        # Ours while we hold the lock: replace whatever is there, never write through a link.
        try:
            os.unlink(info)
        except FileNotFoundError:
            pass
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w") as fh:
            json.dump({"by": args.by, "pid": os.getpid(), "since": time.time()}, fh)
        print(json.dumps({"locked": True, "scan": scan_root(root)}), flush=True)
        serve(root, sys.stdin.buffer, sys.stdout, _patience(args))
    finally:
        try:
            os.unlink(info)
        except OSError:
            pass
    return 0


def _flock_within(fd: int, seconds: float) -> bool:
    """Lock `fd` exclusively, waiting at most `seconds` for another holder to let go; the
    lock is taken the moment it does (a blocking flock cut short by a timer, not polls).
    True also where the filesystem has no flock (some network filesystems): unguarded."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if seconds <= 0:
            return False
    except OSError:
        return True

    def expire(*_) -> None:
        raise TimeoutError

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def _patience(args):
    """The deadline on silence a host-side command was given (``--patience SECONDS``;
    `remote.relay.patience`), or None without one."""
    limit = getattr(args, "patience", None)
    if not limit or limit <= 0:
        return None
    from remote.relay.patience import Patience

    return Patience(limit)


def serve(root: str, requests, answers, patience=None) -> None:
    """Answer the controller's requests about `root`, one JSON line each, until EOF.

    The lock holder serves them on its open channel, so each costs a line each way instead
    of a new SSH session, shell and interpreter (a tenth of a second or more per command
    on a host whose shell start-up is slow). A request is ``{"op": "publish", "name": N,
    "kind": K, "manifest": {...}}`` (see `publish_checkpoint`), ``{"op": "hash",
    "requests": [...]}`` (see `hash_requests`), ``{"op": "scan"}`` or ``{"op": "recv"}``;
    the folder is always `root`, never one the request names. The answer is the
    command's JSON document, or ``{"error": "one line"}``.

    ``{"op": "ping"}`` is answered ``{"pong": true}``: with `patience` (a deadline on the
    controller's silence, `remote.relay.patience`), the controller pings an idle holder,
    and a holder that hears nothing for that long (the controller vanished without
    closing its connection) ends, and its lock with it.

    ``recv`` receives one batch of files on this channel, exactly as ``relay-recv ROOT``
    does (`recv`: its ``{"ready": true}`` line, then the request frame and one frame per
    file on stdin, a line per file once durable), then ``{"done": true}``: a
    destination's first stream needs no SSH session or interpreter of its own, and an
    unchanged relay runs ONE command there. The controller sends the frames only after
    that ready line, so no frame byte sits in this reader's buffer. A batch that fails
    ends with ``{"done": true, "error": "one line"}`` and ends this holder, and so the
    lock: its stream may have stopped inside a frame, where no later line could be told
    from payload.
    """
    call = patience.call if patience is not None else unbounded
    while line := call(requests.readline):
        try:
            req = json.loads(line)
            op = req.get("op") if isinstance(req, dict) else None
            if op == "recv":
                try:
                    recv(_RecvArgs(root, patience))
                except UserError as exc:
                    _emit(answers, {"done": True, "error": str(exc)})
                    return
                except OSError as exc:
                    what = (exc.strerror or str(exc)).lower()
                    _emit(answers, {"done": True, "error": f"{what} in {root}"})
                    return
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    _emit(
                        answers, {"done": True, "error": f"malformed batch ({type(exc).__name__})"}
                    )
                    return
                _emit(answers, {"done": True})
                continue
            if op == "ping":
                answer = {"pong": True}
            elif op == "publish":
                answer = publish_checkpoint(root, req.get("name"), req.get("kind"), req["manifest"])
            elif op == "hash":
                answer = {"hashes": hash_requests(req["requests"])}
            elif op == "scan":
                answer = {"scan": scan_root(root)}
            else:
                raise UserError(f"unknown request {op!r}")
        except UserError as exc:
            answer = {"error": str(exc)}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            answer = {"error": f"malformed request ({type(exc).__name__})"}
        except OSError as exc:
            answer = {"error": f"{(exc.strerror or str(exc)).lower()} in {root}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class _RecvArgs:
    """What `recv` reads of its arguments, for a batch received by `serve` (with the
    holder's own `Patience`, if any)."""

    def __init__(self, root: str, waiter=None):
        self.root = root
        self.waiter = waiter


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None  # unreadable manifest: treated as "not relayed", so it gets redone


# ---- send / receive ---------------------------------------------------------------------


def _emit(stream, record: dict) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()  # the controller may be waiting on this line


def send(args) -> int:
    """Stream several files, one frame each, to stdout; hash every whole file.

    The request is a JSON list on stdin: ``[{"path": P, "offset": N}, ...]``. For each
    file, in order, one frame carries the bytes from N on: its length (the size when
    opened, minus N) and the bytes; the whole file, its first N bytes included, is
    hashed. One process and one ssh channel for a whole checkpoint: per file we measured
    ~0.25 s of process and channel start-up, which made an 8-file checkpoint half as fast
    as one file of the same size. A JSON line per file on stderr gives its index, sha256
    and size, in file order, once its hash is done; a file that cannot be read ends the
    stream (the files before it stand).

    The bytes go from the page cache to stdout by ``sendfile`` (no copy through this
    process into the pipe); the hash reads the same pages into one reused buffer: one copy
    per byte instead of the two of a read and a write (measured on the 2-core test box:
    1.08 CPU-s per GiB instead of 1.21-1.25, 0.83 of it the sha256 itself). A file sent
    whole is hashed block by block in this thread, just before the block goes out (hash
    threads cost more than they saved on a box whose cores are all busy). Every GRID
    bytes the hash state is saved in this host's cache (`states`); a file resumed at an
    offset whose state is there goes the same way from that state, its prefix unread.
    Without one, a resumed file is hashed whole by a `_Hasher` thread while its rest
    streams, and the stream moves on to the next file while that hash finishes. A resumed
    file's line also says how many prefix bytes were hashed again (``prefix_read``).

    Before reading its request it writes a frame: *ready*, empty, or with ``--scan ROOT``
    the `scan_root` of ROOT as JSON. The controller starts a ``relay-send`` ahead, scanning
    the source, while it still plans, and uses it only once that frame came (a process
    that failed to start never sends it); one not needed gets an empty stdin and ends
    quietly.
    """
    _widen_pipe(1)
    # ready; with --scan ROOT the frame holds ROOT's scan (the source's one question,
    # answered by the process that streams next: one command on the source per relay)
    hello = json.dumps(scan_root(args.scan)).encode() if args.scan else b""
    write_all(1, FRAME_HEADER.pack(len(hello)) + hello)
    raw = sys.stdin.buffer.read()
    if not raw.strip():
        return 0  # started ahead and not needed
    requests = json.loads(raw)
    # Files whose hash is still running (index, path, hasher, fd, size): the stream goes
    # on to the next file meanwhile, and their lines follow, in order, once done.
    hashing: list[tuple[int, str, _Hasher, int, int]] = []
    copy = [not hasattr(os, "sendfile")]  # set once sendfile is refused here
    try:
        for i, req in enumerate(requests):
            hashing.append(_send_file(i, req, copy))
            while hashing and (len(hashing) > MAX_HASHING or hashing[0][2].done(hashing[0][4])):
                _finish_hash(*hashing.pop(0))
        while hashing:
            _finish_hash(*hashing.pop(0))
    finally:
        for _, _, hasher, fd, _ in hashing:  # a later file failed: they get no line
            hasher.stop()
            os.close(fd)
    return 0


MAX_HASHING = 8  # files whose hash may still run behind the stream (one descriptor each)
MAX_LAG = 256 * 1024 * 1024  # how far the stream may run ahead of its file's hash


def _finish_hash(i: int, path: str, hasher: _Hasher, fd: int, size: int) -> None:
    try:
        digest = hasher.result(size)
    except OSError:
        raise UserError(f"{path} shrank while it was read") from None
    finally:
        os.close(fd)
    record = {"i": i, "sha256": digest, "size": size}
    if hasher.prefix_read is not None:  # a resumed file: its kept prefix, read again or not
        record["prefix_read"] = hasher.prefix_read
    _emit(sys.stderr, record)


def _send_file(i: int, req: dict, copy: list[bool]) -> tuple:
    """Stream file `i` of a ``relay-send`` request as one frame (see `send`); returns what
    `_finish_hash` needs for its line (index, path, hasher, fd, size), once its hash is
    done."""
    path, offset = req["path"], int(req.get("offset") or 0)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    hasher = None
    cache = states.SourceStates.open(path, fd) if sha256state.available() else None
    try:
        size = os.fstat(fd).st_size
        if size < offset:
            raise UserError(f"{path} holds fewer than {offset} bytes")
        write_all(1, FRAME_HEADER.pack(size - offset))
        # Read, hash and send in this thread (no hand-overs between threads): a file sent
        # whole, or resumed at an offset whose hash state this host saved when it sent it.
        h = sha256state.new() if not offset else cache.lookup(offset) if cache else None
        if h is not None:
            hasher = _hash_and_send(fd, size, path, copy, offset, h, cache)
            hasher.prefix_read = 0 if offset else None
            return i, path, hasher, fd, size
        hasher = _Hasher(fd, size)  # the whole file, from the page cache, in a thread
        hasher.prefix_read = offset
        pos = offset
        while pos < size:
            # A hash far behind the stream (a resumed file's prefix read from a slow disk)
            # would read pages the stream read, and the cache dropped since, again: wait.
            hasher.wait(pos - MAX_LAG, offset)
            n = _send_block(fd, pos, min(CHUNK, size - pos), copy)
            if not n:  # shrank while read: the frame cannot be completed
                raise UserError(f"{path} shrank while it was read")
            pos += n
    except BaseException:
        if hasher is not None:
            hasher.stop()
        os.close(fd)
        raise
    finally:
        if cache is not None:
            cache.close()
    return i, path, hasher, fd, size


class _Hashed:
    """A hash already done, answering like a `_Hasher`."""

    prefix_read: int | None = None

    def __init__(self, digest: str):
        self.digest = digest

    def done(self, size: int) -> bool:
        return True

    def result(self, size: int) -> str:
        return self.digest

    def stop(self) -> None:
        pass


_BUFFER: list[memoryview] = []  # the sender's one read buffer, made on first use


def _hash_and_send(
    fd: int, size: int, path: str, copy: list[bool], pos: int, h, cache=None
) -> _Hashed:
    """Send file `fd` from `pos` on and hash it, `h` being the hash of its first `pos`
    bytes: each block is read into one reused buffer and hashed, then the same bytes go
    out by ``sendfile`` from the page cache (one copy, not the two of a read and a
    write). Blocks end on the `GRID`, where `cache` (the source's saved states) records
    the state reached, for a later resume."""
    if not _BUFFER:
        _BUFFER.append(memoryview(bytearray(CHUNK)))
    buf = _BUFFER[0]
    while pos < size:
        n = os.preadv(fd, [buf[: min(CHUNK, size - pos, GRID - pos % GRID)]], pos)
        if not n:
            raise UserError(f"{path} shrank while it was read")
        h.update(buf[:n])
        end = pos + n
        if cache is not None and end % GRID == 0:
            cache.record(end, h.state())
        while pos < end:
            sent = _send_block(fd, pos, end - pos, copy)
            if not sent:
                raise UserError(f"{path} shrank while it was read")
            pos += sent
    return _Hashed(h.hexdigest())


def _send_block(fd: int, pos: int, count: int, copy: list[bool]) -> int:
    """Write up to `count` bytes of `fd` at `pos` to stdout; bytes written (0 at the end
    of the file). ``sendfile`` where the kernel takes it, else a read and a write."""
    if not copy[0]:
        try:
            return os.sendfile(1, fd, pos, count)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            copy[0] = True  # stdout or this file cannot take it: copy from now on
    block = os.pread(fd, count, pos)
    write_all(1, block)
    return len(block)


def _shown(rel: str) -> str:
    """How a received file is named in messages: ``step_8/model.safetensors``, not the
    partial folder or repair temp file it is written to."""
    parts = rel.split("/")
    if parts[0].startswith(PARTIAL_PREFIX):
        parts[0] = parts[0][len(PARTIAL_PREFIX) :]
    if parts[-1].startswith(REPAIR_PREFIX):
        parts[-1] = parts[-1][len(REPAIR_PREFIX) :]
    return "/".join(parts)


def _write_error(exc: OSError, rel: str) -> UserError:
    what = (exc.strerror or str(exc)).lower()
    return UserError(f"{what} while writing {_shown(rel)}")


def recv(args) -> int:
    """Write the frames on stdin into files under `root`; print each file's summary once it
    is durable.

    stdin starts with a frame holding the JSON request ``[{"path": P, "offset": N,
    "mtime": T, "state": S}, ...]``, then one frame per file in that order. P is relative to `root`
    and must lie in a partial folder (``.partial-<name>/...``) or be a repair temp file
    (``.../.dflash-repair-<file>``); no part of it may be a symlink (each folder is
    opened with O_NOFOLLOW, and so is the file), so nothing the request says can write
    outside `root`. With offset 0 a file is created or truncated; otherwise its first N
    bytes are kept and the frame appended after them, and the file's sha256 is still the
    whole file's, so a resumed file is checked end to end, not just its new tail: from
    the hash state saved at N in its sidecar (`states`, saved every GRID bytes once they
    are durable) where S is true and there is a valid one, else by hashing the kept bytes again
    (``prefix_read`` in its line says which). T, when given, becomes the file's mtime.
    A file's JSON line on stdout (index, sha256 and size of the whole file) comes only
    after its fsync, so the controller publishes nothing that a crash of the host could
    lose. A write error ends the command with one line naming the file and the OS error.
    Its first line, printed before the request is read, is ``{"ready": true}`` (see
    `send`: started ahead, used once ready); stdin closed before any request ends it
    quietly.
    """
    _widen_pipe(0)
    waiter = getattr(args, "waiter", None) or _patience(args)
    call = waiter.call if waiter is not None else unbounded
    _emit(sys.stdout, {"ready": True})
    head = read_exact(0, FRAME_HEADER.size, call)
    if not head:
        return 0  # started ahead and not needed
    if len(head) < FRAME_HEADER.size:
        raise UserError("no request on stdin")
    requests = json.loads(read_exact(0, FRAME_HEADER.unpack(head)[0], call))
    for req in requests:
        _check_target(req.get("path"))
    root_fd = _open_root(args.root)
    syncer = _Syncer()
    spool = _Spool(call)
    try:
        for i, req in enumerate(requests):
            _recv_file(i, req, len(requests), root_fd, syncer, spool)
    finally:
        spool.close()
        syncer.close()
        os.close(root_fd)
    if syncer.error is not None:
        exc, rel = syncer.error
        raise _write_error(exc, rel)
    return 0


def _recv_file(i: int, req: dict, total: int, root_fd: int, syncer: _Syncer, spool: _Spool):
    """Receive file `i` of a ``relay-recv`` request (see `recv`): this thread reads its
    frame from stdin into the spool's buffers and hashes them, the spool's thread writes
    them (and feeds a resumed file's hasher); the fsync and the file's line follow in the
    syncer's thread."""
    rel = req["path"]
    head = read_exact(0, FRAME_HEADER.size, spool.call)
    if len(head) < FRAME_HEADER.size:
        raise UserError(f"the stream ended after {i} of {total} files")
    left = FRAME_HEADER.unpack(head)[0]
    try:
        t = _open_for_write(root_fd, rel, int(req.get("offset") or 0), req.get("state") is True)
    except OSError as exc:
        raise _write_error(exc, rel) from None
    fd, direct, size = t.fd, t.direct, t.size
    out = _Writer(fd, direct, size)
    # A resumed file without a saved state at its offset: its kept prefix is hashed in a
    # thread (read with O_DIRECT, as it was written) while the rest arrives; the new bytes
    # follow, from memory as far as KEEP allows, not before the first byte is read.
    h = t.h if t.h is not None else None if size else hashlib.sha256()
    hasher = _Hasher(fd, size, direct=direct is not None, keep=KEEP) if h is None else None
    record_states = t.saved is not None  # blocks end on the GRID, whose states are saved
    written = [size]

    def store(block: memoryview, state: bytes | None = None) -> None:  # spool's thread
        syncer.wrote(fd, out.write(block), rel)
        written[0] += len(block)
        if hasher is not None:
            hasher.advance(written[0], block)
        if state is not None:
            end = written[0]
            syncer.durable(fd, lambda: t.save(root_fd, rel, end, state))

    try:
        while left:
            # until the file offset is aligned, read only up to the boundary
            boundary = (-size) % ALIGN if direct is not None else 0
            want = min(left, boundary or CHUNK)
            if record_states:
                want = min(want, GRID - size % GRID)
            block = spool.read(want)
            if not block:
                raise UserError(f"the stream ended inside {_shown(rel)}")
            if hasher is None:
                h.update(block)  # here: the stdin pipe fills meanwhile, for fewer reads
            if record_states and (size + len(block)) % GRID == 0:
                spool.put(functools.partial(store, state=h.state()), block)
            else:
                spool.put(store, block)
            size += len(block)
            left -= len(block)
        spool.drain()  # every block written (or the first error raised)
        if req.get("mtime") is not None:
            os.utime(fd, (float(req["mtime"]), float(req["mtime"])))
        record = {"i": i, "sha256": h.hexdigest() if hasher is None else None, "size": size}
        if t.size:  # a resumed file: its kept prefix, read again (fallback) or not
            record["prefix_read"] = t.size if hasher is not None else 0
        hashing, hasher = hasher, None
    except OSError as exc:
        _abandon(spool, syncer, out, hasher, fd)  # the partial file stays, to be resumed
        raise _write_error(exc, rel) from None
    except BaseException:
        _abandon(spool, syncer, out, hasher, fd)
        raise
    out.close()

    def finish(r=record, hs=hashing, n=size) -> None:  # in the syncer's thread
        r["sha256"] = hs.result(n)

    syncer.file_done(fd, lambda r=record: _emit(sys.stdout, r), rel, finish if hashing else None)


class _Spool:
    """Blocks read from stdin, written to disk by a second thread.

    An O_DIRECT write waits for the disk (about 1 s per GiB on the test box), while the
    1 MiB pipe from sshd holds only milliseconds of the stream: written inline, every
    write stalled sshd and the ssh chain behind it. Here the reading thread reads and
    hashes (a fresh file's hash stays there, so the pipe fills meanwhile and each read
    takes more at once: draining it after every 32 KiB packet cost more CPU than it
    saved), and this thread writes. On the test box that took a 1 GiB receive from
    about 4 s to about 2.7 s of wall time at the same CPU. `SPOOL` page-aligned buffers
    (O_DIRECT needs aligned addresses) go round: `read` fills a free one, `put` queues
    it with the function that consumes it, the thread gives it back. A consumer's error
    is raised by the next `read` or `drain`; the blocks after it are skipped.
    """

    def __init__(self, call=unbounded):
        import queue
        import threading

        self.call = call  # how a read from stdin is made (`_fill`)
        self.free: queue.Queue = queue.Queue()
        for _ in range(SPOOL):
            self.free.put(memoryview(mmap.mmap(-1, CHUNK)))
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.current: memoryview | None = None  # the buffer `read` filled last
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for job in iter(self.jobs.get, None):
            fn, block, buf = job
            try:
                if self.error is None:
                    fn(block)
            except BaseException as exc:  # raised in the reading thread
                self.error = exc
            finally:
                self.free.put(buf)
                self.jobs.task_done()

    def _raise(self) -> None:
        if self.error is not None:  # stays: the blocks queued after it are not written
            raise self.error

    def read(self, limit: int) -> memoryview:
        """Up to `limit` bytes (at most CHUNK) from stdin in a free buffer; fewer only at
        the end of the stream."""
        buf = self.free.get()
        try:
            self._raise()
            n = _fill(0, buf[: min(limit, CHUNK)], self.call)
        except BaseException:
            self.free.put(buf)
            raise
        if not n:
            self.free.put(buf)
        self.current = buf
        return buf[:n]

    def put(self, fn, block: memoryview) -> None:
        """Queue `fn(block)` for the thread; `block` is what `read` returned last."""
        self.jobs.put((fn, block, self.current))

    def drain(self) -> None:
        """Wait until every queued block is consumed; raise the first error met."""
        self.jobs.join()
        self._raise()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


SPOOL = 4  # buffers of CHUNK bytes between the reading thread and the writing one


KEEP = 128 * 1024 * 1024  # new bytes of a resumed file queued in memory for its hash


def _abandon(spool: _Spool, syncer: _Syncer, out: _Writer, hasher: _Hasher | None, fd: int) -> None:
    """Close a file whose receive failed (its queued writes, syncs and hashing thread end
    first)."""
    try:
        spool.drain()
    except BaseException:
        pass  # the error being handled is the one reported
    syncer.settle()
    out.close()
    if hasher is not None:
        hasher.stop()
    os.close(fd)


def _check_target(rel) -> None:
    """Refuse a requested write path outside a partial folder or repair temp file."""
    why = path_problem(rel)
    if why is None and not (
        rel.split("/")[0].startswith(PARTIAL_PREFIX)
        or rel.rsplit("/", 1)[-1].startswith(REPAIR_PREFIX)
    ):
        why = "is neither in a partial folder nor a repair file"
    if why is not None:
        raise UserError(f"refusing to write {rel!r}: the path {why}")


def _open_root(root: str) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UserError(f"cannot use {root}: {(exc.strerror or str(exc)).lower()}") from None


def _open_dirs(root_fd: int, parts: list[str], create: bool, rel: str) -> int:
    """A descriptor of the folder `parts` under `root_fd`, every part opened with
    O_NOFOLLOW (a symlink on the way is refused, naming it); created when `create`."""
    skip = len(rel.split("/")) - 1 - len(parts)  # leading parts of `rel` already opened
    fd = os.dup(root_fd)
    try:
        for n, part in enumerate(parts):
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(
                    f"/proc/self/fd/{fd}/{part}"
                ):
                    raise UserError(
                        f"refusing to write {_shown(rel)} through the symlink "
                        f"{'/'.join(rel.split('/')[: skip + n + 1])}"
                    ) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_leaf(dir_fd: int, name: str, flags: int, rel: str) -> int:
    """Open file `name` in `dir_fd` with O_NOFOLLOW; a symlink there is refused by name."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"refusing to write through the symlink {rel}") from None
        raise


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

    def __init__(self, fd: int, direct: int | None, pos: int):
        self.fd, self.pos, self.direct = fd, pos, direct

    def write(self, block: memoryview) -> int:
        """Write `block` (starting at an aligned address) at the current offset; returns the
        bytes that went through the page cache (for the syncer)."""
        n = (
            len(block) - len(block) % ALIGN
            if self.direct is not None and self.pos % ALIGN == 0
            else 0
        )
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


class _Target:
    """A file being received: its descriptors, the hash of its first `size` bytes when
    known without reading them (fresh, or resumed from a saved state), and its saved
    states (`states`), recorded in its sidecar as the bytes become durable."""

    def __init__(self, fd: int, direct: int | None, size: int):
        self.fd, self.direct, self.size = fd, direct, size
        self.h = None  # hash of the first `size` bytes, or None: the fallback hashes them
        self.saved: dict[int, bytes] | None = None  # None: no states kept for this file
        self.stat: os.stat_result | None = None

    def save(self, root_fd: int, rel: str, offset: int, state: bytes) -> None:
        """Record the state at `offset` in the sidecar (in the syncer's thread, after the
        fdatasync); a sidecar that cannot be written only costs a later prefix hash."""
        parts = rel.split("/")
        try:
            dfd = _open_dirs(root_fd, parts[:-1], False, rel)
        except (OSError, UserError):
            return
        try:
            self.saved[offset] = state
            states.write_sidecar(dfd, parts[-1], self.stat, self.saved)
        except OSError:
            pass
        finally:
            os.close(dfd)


def _open_for_write(root_fd: int, rel: str, offset: int, use_state: bool = False) -> _Target:
    """`rel` under `root_fd` opened to append after `offset` (its first `offset` bytes
    kept), never through a symlink. A file in a partial folder keeps hash states in a
    sidecar (`states`): resumed at an offset it holds one for, and asked to use it
    (`use_state`: the controller chose the offset from this host's scan; ``--verify``
    does not), the hash goes on from there; its states past `offset` are dropped before
    the file is truncated."""
    parts = rel.split("/")
    dfd = _open_dirs(root_fd, parts[:-1], True, rel)
    try:
        fd = _open_leaf(dfd, parts[-1], os.O_RDWR | os.O_CREAT, rel)
        direct, flag = None, _direct_flag()
        if flag:
            try:
                direct = _open_leaf(dfd, parts[-1], os.O_WRONLY | flag, rel)
            except OSError:
                pass  # not supported here: buffered writes only
        t = _Target(fd, direct, offset)
        try:
            # A writer from a dropped connection may still be draining its pipe into this
            # file: wait for it, so the truncate below cannot be overtaken by its late bytes.
            fcntl.flock(fd, fcntl.LOCK_EX)
            t.stat = os.fstat(fd)
            got = t.stat.st_size
            if got < offset:
                raise UserError(f"{_shown(rel)} holds {got} bytes, fewer than the offset {offset}")
            if parts[0].startswith(PARTIAL_PREFIX) and sha256state.available():
                kept = states.read_sidecar(dfd, parts[-1], t.stat) if use_state else {}
                t.h = sha256state.new(kept[offset], offset) if offset in kept else None
                if t.h is not None or not offset:
                    t.h = t.h or sha256state.new()
                    t.saved = {k: v for k, v in kept.items() if k <= offset}
                try:
                    states.write_sidecar(dfd, parts[-1], t.stat, t.saved or {})
                except OSError:
                    t.saved = None  # cannot be written here: no states for this file
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            if direct is not None:
                os.close(direct)
            raise
    finally:
        os.close(dfd)
    return t


def hash_files(args) -> int:
    """sha256 of files or of their first `length` bytes; requests as a JSON list on stdin."""
    print(json.dumps(hash_requests(json.load(sys.stdin))))
    return 0


def hash_requests(requests: list) -> list[dict]:
    """Per request ``{"path": P, "length": L or None}``: ``{"path", "length" (bytes
    hashed), "sha256", "complete" (all L bytes were there)}`` or ``{"path", "error"}``."""
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
        out.append(
            {
                "path": path,
                "length": n,
                "sha256": h.hexdigest(),
                "complete": length is None or n == length,
            }
        )
    return out


# ---- publish ----------------------------------------------------------------------------


def publish(args) -> int:
    """Publish a verified partial checkpoint with one rename; JSON manifest read on stdin.

    A folder checkpoint: the manifest goes inside the partial folder, which is then renamed
    to its final name. A single-file checkpoint: the manifest is written beside it as
    ``.<name>.dflash-manifest.json``, then the file is renamed into place. A checkpoint
    that already exists (the source changed) is moved aside first and removed after.
    Every file of the manifest must be in the partial folder at its full size, as a
    regular file reached without a symlink; each gets the source's mtime, and the mtime
    this filesystem then reports is recorded in the manifest (``stored_mtime``), so the
    next relay sees a file changed or truncated since without hashing it.
    """
    print(json.dumps(publish_checkpoint(args.root, args.name, args.kind, json.load(sys.stdin))))
    return 0


def publish_checkpoint(root: str, name, kind, manifest) -> dict:
    """Publish partial checkpoint `name` under `root` (see `publish`); ``{"published": path}``."""
    if kind not in ("dir", "file") or not isinstance(manifest, dict):
        raise UserError(f"refusing to publish {name!r}: malformed request")
    why = name_problem(name)
    if why is not None:
        raise UserError(f"refusing to publish {name!r}: the name {why}")
    pname = PARTIAL_PREFIX + name
    partial = os.path.join(root, pname)
    root_fd = _open_root(root)
    try:
        try:
            pfd = os.open(pname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError:
            raise UserError(f"nothing to publish: {partial} is missing or not a folder") from None
        try:
            for f in manifest.get("files", []):
                _settle(pfd, f, name, partial)
            states.remove_sidecars(pfd)  # hash states of partial files: not published
            data = json.dumps(manifest, indent=2).encode()
            if kind == "dir":
                write_new(pfd, MANIFEST, data)
            else:
                write_new(root_fd, f".{name}{MANIFEST}", data)
        finally:
            os.close(pfd)
        old = None
        try:
            os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            old = f".old-{name}-{os.getpid()}"
            os.rename(name, old, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        except FileNotFoundError:
            pass
        if kind == "dir":
            os.rename(pname, name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        else:
            os.rename(f"{pname}/{name}", name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            shutil.rmtree(partial, ignore_errors=True)
        try:
            os.fsync(root_fd)
        except OSError:
            pass
    finally:
        os.close(root_fd)
    if old:
        old = os.path.join(root, old)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)
    return {"published": os.path.join(root, name)}


def _settle(pfd: int, f: dict, name: str, partial: str) -> None:
    """Check one manifest file in the partial folder (a regular file of its full size,
    no symlink on the way), give it its mtime and record the mtime it then has."""
    rel = f.get("path")
    why = path_problem(rel)
    if why is not None:
        raise UserError(f"refusing to publish {name}: the manifest path {rel!r} {why}")
    parts = rel.split("/")
    size = None
    try:
        dfd = _open_dirs(pfd, parts[:-1], False, f"{PARTIAL_PREFIX}{name}/{rel}")
    except OSError:
        dfd = None
    if dfd is not None:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UserError(
                    f"refusing to publish {name}: {rel} in {partial} is a "
                    "symlink; remove it and run the relay again"
                )
            if stat.S_ISREG(st.st_mode):
                size = st.st_size
            if size == f.get("size") and isinstance(f.get("mtime"), (int, float)):
                os.utime(parts[-1], (f["mtime"], f["mtime"]), dir_fd=dfd, follow_symlinks=False)
                f["stored_mtime"] = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)
    # The last guard of "never half a checkpoint": every file of the manifest is there at
    # its full size, whatever happened to the partial folder since it was verified.
    if size != f.get("size"):
        raise UserError(
            f"{name} is not published: {rel} holds "
            f"{'nothing' if size is None else f'{size} bytes'} in {partial}, "
            f"not {f.get('size')}; run the relay again"
        )


_PATIENCE_HELP = "end after this many seconds blocked on a silent controller (0: never)"


def register(sub) -> None:
    # The controller puts every positional argument after "--": a checkpoint or folder
    # name starting with "-" is then a name, not an option.
    p = sub.add_parser("relay-scan", help="list checkpoints, manifests, partials, free space")
    p.add_argument("root")
    p.set_defaults(func=scan)
    p = sub.add_parser("relay-lock", help="hold the relay lock of a folder until stdin closes")
    p.add_argument("root")
    p.add_argument("--by", default="", help="who holds it, for the message another relay shows")
    p.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the lock")
    p.add_argument("--patience", type=float, default=PATIENCE, help=_PATIENCE_HELP)
    p.set_defaults(func=hold_lock)
    p = sub.add_parser("relay-send", help="stream files (JSON list on stdin) as frames")
    p.add_argument("--scan", default=None, help="put this folder's scan in the ready frame")
    p.set_defaults(func=send)
    p = sub.add_parser("relay-recv", help="write frames on stdin into files under ROOT")
    p.add_argument("root")
    p.add_argument("--patience", type=float, default=PATIENCE, help=_PATIENCE_HELP)
    p.set_defaults(func=recv)
    p = sub.add_parser("relay-hash", help="sha256 of files or prefixes (JSON on stdin)")
    p.set_defaults(func=hash_files)
    p = sub.add_parser("relay-publish", help="publish a partial checkpoint by rename")
    p.add_argument("root")
    p.add_argument("name")
    p.add_argument("--kind", choices=("dir", "file"), required=True)
    p.set_defaults(func=publish)
