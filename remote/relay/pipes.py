"""How a relay host command talks with the controller on stdin and stdout (stdlib only)."""

from __future__ import annotations

import fcntl
import json
import os
import stat

from remote.relay.wire import unbounded

CHUNK = 4 * 1024 * 1024


PIPE_SIZE = 1024 * 1024  # Linux's default pipe-max-size


def widen_pipe(fd: int) -> None:
    """Grow a pipe's buffer (Linux) so each read or splice moves more than 64 KiB."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        pass


def fill(fd: int, view: memoryview, call=unbounded) -> int:
    """Read from `fd` until `view` is full or the stream ends; bytes read."""
    filled = 0
    while filled < len(view):
        n = call(os.readv, fd, [view[filled:]])
        if not n:
            break
        filled += n
    return filled


def emit(stream, record: dict) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()


PATIENCE_HELP = "end after this many seconds blocked on a silent controller (0: never)"


def patience_of(args):
    """The `Patience` of a command's ``--patience SECONDS``, or None without one."""
    limit = getattr(args, "patience", None)
    if not limit or limit <= 0:
        return None
    from remote.relay.patience import Patience

    return Patience(limit)
