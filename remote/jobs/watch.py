"""``job watch``: a job's events as they are appended, to the end of the job."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from remote.jobs.folder import job_state, result_files
from remote.protocol import TERMINAL_STATES, WATCH_END_EVENT, WATCH_HEARTBEAT_SECONDS

HEARTBEAT_SECONDS = WATCH_HEARTBEAT_SECONDS
# the full state at least this often notices a runner that died silently
WATCH_POLL_SECONDS = 0.05
STATE_POLL_SECONDS = 1.0


def watch(
    path: Path,
    offset: int,
    out: Callable[[str], None],
    poll: float = WATCH_POLL_SECONDS,
    pull: bool = False,
) -> dict:
    """Print events from byte `offset` on as appended; end with a ``watch_end`` event (with
    `pull`, the result files). A heartbeat ends a watcher whose controller went away."""
    events = path / "events.jsonl"
    buf = b""
    last_beat = last_state = time.monotonic()
    ended = False

    def drain() -> None:
        nonlocal offset, buf, ended
        try:
            with open(events, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return
        offset += len(data)
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                ended = ended or line.startswith(b'{"event": "end"')
                out(line.decode(errors="replace"))

    while True:
        drain()
        now = time.monotonic()
        if ended or now - last_state >= STATE_POLL_SECONDS or (path / "exit.json").exists():
            last_state = now
            state = job_state(path)
            if state["state"] in TERMINAL_STATES:
                drain()
                end = {
                    "event": WATCH_END_EVENT,
                    "state": state["state"],
                    "offset": offset,
                    "exit": state["exit"],
                    "has_result": state["has_result"],
                    "dir": str(path),
                }
                if pull:
                    end["files"] = result_files(path)
                out(json.dumps(end))
                return end
        if now - last_beat > HEARTBEAT_SECONDS:
            out(json.dumps({"event": "heartbeat", "offset": offset}))
            last_beat = now
        time.sleep(poll)
