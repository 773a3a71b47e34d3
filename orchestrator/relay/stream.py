"""The relay's data path: frames pumped between OpenSSH clients through this machine's
pipes, never its disk (docs/relay.md, "Data path")."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from orchestrator.inventory import Inventory
from orchestrator.transport.hosts import Host, last_line
from orchestrator.transport.master import Multiplexer
from orchestrator.transport.openssh import host_key_error
from orchestrator.transport.openssh_host import stream_argv
from remote.errors import ERROR_PREFIX
from remote.relay.fdfiles import write_all
from remote.relay.pipes import PIPE_SIZE, widen_pipe
from remote.relay.wire import FRAME_HEADER, PATIENCE, read_exact

CHUNK = 4 * 1024 * 1024
# After a move shorter than BATCH the pump naps so the pipe fills: fewer, larger moves.
BATCH = 256 * 1024
NAP = 0.002
MAX_HELLO = 256 * 1024 * 1024  # the largest ready frame (a scan) accepted
# Half the hosts' patience, so this side notices a stall first and says who.
STALL = PATIENCE / 2


class Stream:
    """One running ``ssh`` (or local bash) command with raw pipe file descriptors."""

    def __init__(
        self,
        host: Host,
        line: str,
        inventory: Inventory | None,
        *,
        stdin: bool,
        stdout: bool,
        mux: Multiplexer | None = None,
    ):
        self.host = host
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            stream_argv(host, line, inventory, mux),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stderr=self._err,
            bufsize=0,
            start_new_session=True,
        )  # Ctrl-C reaches us; we end them ourselves
        self.failed: str | None = None
        self.stalled: str | None = None
        self.line = line
        self.argv: list[str] | None = None
        self._ready: bool | None = None
        self.hello = b""
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                widen_pipe(pipe.fileno())

    def wait_ready(self) -> bool:
        """Read the command's ready frame or line once: whether the host command runs."""
        if self._ready is None:
            if "relay-send" in self.line:
                head = read_exact(self.stdout_fd, FRAME_HEADER.size)
                n = FRAME_HEADER.unpack(head)[0] if len(head) == FRAME_HEADER.size else -1
                n = n if n <= MAX_HELLO else -1
                self.hello = read_exact(self.stdout_fd, n) if n > 0 else b""
                self._ready = n >= 0 and len(self.hello) == n
            else:
                line = b""
                while not line.endswith(b"\n") and len(line) < 64:
                    block = os.read(self.stdout_fd, 1)
                    if not block:
                        break
                    line += block
                self._ready = line.strip() == b'{"ready": true}'
        return self._ready

    @property
    def stdin_fd(self) -> int:
        return self.proc.stdin.fileno()

    @property
    def stdout_fd(self) -> int:
        return self.proc.stdout.fileno()

    def close_stdin(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def finish(self) -> tuple[int, bytes, str]:
        """Wait; (exit code, rest of stdout, stderr)."""
        self.close_stdin()
        out = b""
        if self.proc.stdout:
            out = self.proc.stdout.read() or b""
            self.proc.stdout.close()
        code = self.proc.wait()
        self._err.seek(0)
        err = self._err.read().decode(errors="replace")
        self._err.close()
        return code, out, err

    def end_frames(self, whole: bool = True) -> None:
        """A batch's frames are written: a receiver of its own gets EOF."""
        self.close_stdin()

    def end_batch(self) -> tuple[int, bytes, str]:
        return self.finish()

    def describe(self, code: int, err: str) -> str:
        """One line naming the host for this command's failure or stall."""
        if self.stalled:
            return f"{self.host.name}: {self.stalled}"
        return describe_failure(self.host, code, err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass


def file_lines(text: str) -> dict[int, dict]:
    """The per-file JSON lines of a relay command's output, by index."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("i"), int):
                out[record["i"]] = record
    return out


def describe_failure(host: Host, code: int, err: str) -> str:
    """One line naming `host` and what failed there."""
    said = last_line("\n".join(ln for ln in err.splitlines() if not ln.lstrip().startswith("{")))
    if code == 255:
        refused = host_key_error(host, err)
        if refused is not None:
            return str(refused)
        return f"connection to {host.name} lost ({said or 'ssh exit 255'})"
    for line in reversed(err.splitlines()):
        if line.startswith(ERROR_PREFIX):
            return f"{host.name}: {line[len(ERROR_PREFIX) :]}"
    return f"{host.name}: exit {code}: {said or 'no message'}"


def send_request(dest: Stream, request: list[dict]) -> None:
    """Give a ``relay-recv`` its request frame."""
    data = json.dumps(request).encode()
    _write(dest, FRAME_HEADER.pack(len(data)) + data)


class Pumped(NamedTuple):
    """Bytes read per file, and per destination whether it got all its frames whole."""

    read: list[int]
    whole: list[bool]


def pump(
    src: Stream,
    dests: Sequence[Stream],
    routes: Sequence[Sequence[int | None]],
    on_bytes: Callable[[int], None] | None = None,
    cancelled: threading.Event | None = None,
    stall: float = STALL,
) -> Pumped:
    """Move the source's frames to the destinations: ``routes[i][d]`` is None or the bytes
    of file i destination d holds already. A broken or stalled destination is dropped."""
    read: list[int] = []
    lengths: list[int] = []
    src_fd = src.stdout_fd
    splice_ok = hasattr(os, "splice")
    watch = _Watch(src, dests, stall)
    try:
        src.wait_ready()
        for route in routes:
            if all(d.failed is not None for d in dests):
                break
            head = read_exact(src_fd, FRAME_HEADER.size)
            if len(head) < FRAME_HEADER.size:
                break  # the source stopped; its exit status says why
            length = FRAME_HEADER.unpack(head)[0]
            lengths.append(length)
            takers = [
                d for d, skip in enumerate(route) if skip is not None and dests[d].failed is None
            ]
            for d in takers:
                _write(dests[d], FRAME_HEADER.pack(max(0, length - route[d])))
            takers = [d for d in takers if dests[d].failed is None]
            if splice_ok and len(takers) == 1 and route[takers[0]] == 0:
                got, splice_ok = _splice(
                    src_fd, dests[takers[0]], length, on_bytes, cancelled, watch
                )
                if (
                    got < length
                    and dests[takers[0]].failed is not None
                    and any(d.failed is None for d in dests)
                ):
                    # its receiver broke mid-frame: read past the rest for the others
                    got += _fan_out(src_fd, [], length - got, None, cancelled, watch)
            else:
                got = _fan_out(
                    src_fd,
                    [(dests[d], route[d]) for d in takers],
                    length,
                    on_bytes,
                    cancelled,
                    watch,
                )
            read.append(got)
            if got < length:
                break
    finally:
        watch.stop()
    # From the first frame not read in full, a destination owed a frame waits.
    short = [i for i, (n, got) in enumerate(zip(lengths, read, strict=True)) if got < n]
    cut = short[0] if short else len(read)
    whole = [
        d.failed is None and all(route[j] is None for route in routes[cut:])
        for j, d in enumerate(dests)
    ]
    return Pumped(read, whole)


class _Watch:
    """Ends the silent source, else each destination taking nothing, after `stall` s."""

    def __init__(self, src: Stream, dests: Sequence[Stream], stall: float):
        self.src, self.dests, self.stall = src, dests, stall
        self.stamp = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="relay-watch")
        self.thread.start()

    def moved(self) -> None:
        self.stamp = time.monotonic()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.done.wait(min(1.0, self.stall / 4)):
            if time.monotonic() - self.stamp > self.stall:
                self._end_stalled()
                self.stamp = time.monotonic()

    def _end_stalled(self) -> None:
        quiet = f"no bytes for {self.stall:g} s (stalled)"
        if not _ready(self.src.stdout_fd, select.POLLIN):
            victims = [(self.src, f"sent {quiet}")]
        else:
            victims = [
                (d, f"took {quiet}")
                for d in self.dests
                if d.failed is None and not _ready(d.stdin_fd, select.POLLOUT)
            ]
        for s, why in victims:
            s.stalled = s.stalled or why
            s.failed = s.failed or why
            s.kill()


def _ready(fd: int, event: int) -> bool:
    """Whether pipe `fd` is ready for `event` now (closed or broken counts as ready)."""
    try:
        poller = select.poll()
        poller.register(fd, event)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _write(dest: Stream, data: bytes | memoryview) -> None:
    try:
        write_all(dest.stdin_fd, data)
    except OSError as exc:
        dest.failed = f"write failed ({exc.strerror or exc})"


def _batch(*fds: int) -> int:
    """`BATCH`, or 0 (never nap) when a pipe is narrower than `PIPE_SIZE`."""
    for fd in fds:
        try:
            if fcntl.fcntl(fd, getattr(fcntl, "F_GETPIPE_SZ", 1032)) < PIPE_SIZE:
                return 0
        except OSError:
            return 0
    return BATCH


def _check(cancelled: threading.Event | None) -> None:
    if cancelled is not None and cancelled.is_set():
        raise KeyboardInterrupt


def _splice(
    src_fd: int, dest: Stream, length: int, on_bytes, cancelled, watch: _Watch
) -> tuple[int, bool]:
    """Splice one frame; (bytes moved, whether splice still works here)."""
    done, batch = 0, _batch(src_fd, dest.stdin_fd)
    while done < length:
        _check(cancelled)
        try:
            n = os.splice(src_fd, dest.stdin_fd, min(CHUNK, length - done))
        except BrokenPipeError:
            dest.failed = "write failed (pipe closed)"
            break
        except OSError as exc:
            if exc.errno == 22 and done == 0:  # EINVAL: this kernel cannot splice these
                return _fan_out(src_fd, [(dest, 0)], length, on_bytes, cancelled, watch), False
            dest.failed = f"write failed ({exc.strerror})"
            break
        if n == 0:
            break
        done += n
        watch.moved()
        if on_bytes:
            on_bytes(n)
        if n < batch and done < length:
            time.sleep(NAP)
    return done, True


def _fan_out(
    src_fd: int, dests: list[tuple[Stream, int]], length: int, on_bytes, cancelled, watch: _Watch
) -> int:
    """Copy one frame to each (receiver, bytes it skips); bytes read."""
    pos, batch = 0, _batch(src_fd, *(d.stdin_fd for d, _ in dests))
    while pos < length:
        _check(cancelled)
        block = os.read(src_fd, min(CHUNK, length - pos))
        if not block:
            break
        watch.moved()
        delivered = 0
        for dest, skip in dests:
            start = max(0, skip - pos)
            if dest.failed is not None or start >= len(block):
                continue
            _write(dest, memoryview(block)[start:])
            if dest.failed is None:
                delivered = max(delivered, len(block) - start)
                watch.moved()
        pos += len(block)
        if on_bytes and delivered:
            on_bytes(delivered)
        if len(block) < batch and pos < length:
            time.sleep(NAP)
    return pos
