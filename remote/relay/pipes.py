"""How a relay host command talks with the controller on its pipes (stdin, stdout).

Large blocks (`CHUNK`) through widened pipes (`widen_pipe`), a read that fills a whole
buffer (`fill`), one JSON line per record (`emit`), and the deadline on the controller's
silence a command was given (`patience_of`). Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat

from remote.relay.wire import unbounded

CHUNK = 4 * 1024 * 1024  # large reads/writes: small ones make the Python paths crawl


PIPE_SIZE = 1024 * 1024  # Linux's default pipe-max-size; 64 KiB pipes mean 64 KiB reads


def widen_pipe(fd: int) -> None:
    """Grow a pipe's buffer so each read moves up to 1 MiB, not 64 KiB (Linux only): with
    the default every read, write or splice moves 64 KiB and the per-call costs dominate.
    Both ends of the relay's streams widen theirs: the hosts' commands and the
    controller's pump (`orchestrator.relay.stream`)."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        pass  # not a pipe, or not allowed: smaller reads still work


def fill(fd: int, view: memoryview, call=unbounded) -> int:
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


def emit(stream, record: dict) -> None:
    """`record` as one JSON line on `stream` (a text file), flushed."""
    stream.write(json.dumps(record) + "\n")
    stream.flush()  # the controller may be waiting on this line


PATIENCE_HELP = "end after this many seconds blocked on a silent controller (0: never)"


def patience_of(args):
    """The deadline on silence a host-side command was given (``--patience SECONDS``;
    `remote.relay.patience`), or None without one."""
    limit = getattr(args, "patience", None)
    if not limit or limit <= 0:
        return None
    from remote.relay.patience import Patience

    return Patience(limit)
