"""``dflash follow``: evaluate each new checkpoint of a training run once (docs/follow.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.eval.follow.checkpoint import CheckpointFollower, check_target
from orchestrator.eval.follow.options import FollowEvents, FollowOptions
from orchestrator.eval.follow.options import follow_request as follow_request
from orchestrator.eval.follow.state import (
    HISTORY,
    PLOT,
    FollowError,
    FollowState,
    read_history,
    redraw,
    state_dir,
)
from orchestrator.inventory import Inventory
from orchestrator.relay import run as relay
from orchestrator.results import export


def _check_hosts(inventory: Inventory, source: str, dest: str) -> None:
    if inventory.host(source).trainer is None:
        raise FollowError(
            f"{source} has no trainer role in the inventory; follow needs "
            "'roles: {trainer: {checkpoints: DIR}}' on it"
        )
    if inventory.host(dest).eval is None:
        raise FollowError(
            f"{dest} has no eval role in the inventory; follow needs "
            "'roles: {eval: {drafters: DIR, target_model: ...}}' on it"
        )


def follow_pass(
    inventory: Inventory,
    source: str,
    dest: str,
    options: FollowOptions | None = None,
    events: FollowEvents | None = None,
    stop: threading.Event | None = None,
) -> list[dict]:
    """One pass over the checkpoints not yet in the history, in-flight first; the entries."""
    options = options or FollowOptions()
    events = events or FollowEvents()
    _check_hosts(inventory, source, dest)
    st = FollowState(state_dir(inventory, source, dest, options), source, dest)
    trackers: list[export.Tracker] = []
    try:
        trackers = open_trackers(options, st.dir)
        check_target(inventory, dest, options.eval)
        return _pass(inventory, source, dest, options, events, st, stop, trackers)
    finally:
        _close(trackers)
        st.close()


def open_trackers(options: FollowOptions, folder: Path) -> list[export.Tracker]:
    """The trackers `options` asks for, opened before any checkpoint is touched."""
    out: list[export.Tracker] = []
    try:
        if options.tensorboard:
            out.append(export.TensorBoardTracker(options.tensorboard))
        if options.wandb:
            out.append(export.WandbTracker(options.wandb, folder))
    except DflashError:
        _close(out)
        raise
    return out


def _close(trackers: list[export.Tracker]) -> None:
    for t in trackers:
        t.close()


class StatusLines:
    """Status lines said once per kind until their text changes; `forget` lets a kind speak."""

    def __init__(self, events: FollowEvents):
        self.events = events
        self.said: dict[str, str] = {}

    def say(self, key: str, text: str) -> None:
        if self.said.get(key) != text:
            self.said[key] = text
            self.events.message(text)

    def forget(self, *keys: str) -> None:
        for key in keys or list(self.said):
            self.said.pop(key, None)


def _pass(
    inventory,
    source,
    dest,
    options,
    events,
    st: FollowState,
    stop: threading.Event | None,
    trackers: list[export.Tracker],
    status: StatusLines | None = None,
) -> list[dict]:
    status = status or StatusLines(events)
    listing = relay.list_checkpoints(inventory, source, [dest])
    done = st.done()
    for name in [n for n in st.inflight if n in done]:  # recorded, note left by a crash
        st.inflight.pop(name)
    todo = [
        (c["step"], c["name"])
        for c in listing["checkpoints"]
        if c["complete"] and c["name"] not in done
    ]
    listed = {name for _, name in todo}
    gone = [
        (saved.get("step"), name) for name, saved in st.inflight.items() if name not in listed
    ]  # left in flight, since deleted by the trainer
    todo += gone
    waiting = [
        c["name"] for c in listing["checkpoints"] if not c["complete"] and c["name"] not in done
    ]
    if waiting:
        status.say("incomplete", f"not complete yet: {', '.join(waiting)}")
    todo.sort(key=lambda sn: (sn[1] not in st.inflight, sn[0] if sn[0] is not None else -1, sn[1]))
    follower = CheckpointFollower(inventory, source, dest, options, events, trackers)
    recorded = []
    for step, name in todo:
        if stop is not None and stop.is_set():
            break
        entry = follower.process(st, name, step, on_trainer=name in listed)
        if entry is not None:
            events.recorded(entry)
            recorded.append(entry)
    return recorded


def follow(
    inventory: Inventory,
    source: str,
    dest: str,
    options: FollowOptions | None = None,
    events: FollowEvents | None = None,
    stop: threading.Event | None = None,
    sleep: Callable[[float], Any] | None = None,
) -> None:
    """Passes every ``options.interval`` seconds until `stop` or Ctrl-C, the folder locked."""
    options = options or FollowOptions()
    events = events or FollowEvents()
    stop = stop or threading.Event()
    _check_hosts(inventory, source, dest)
    st = FollowState(state_dir(inventory, source, dest, options), source, dest)
    trackers: list[export.Tracker] = []
    try:
        trackers = open_trackers(options, st.dir)
        status = StatusLines(events)
        every = f"every {options.interval:g}s"
        checked = False  # the eval host's target, asked once (`check_target`)
        while not stop.is_set():
            try:
                if not checked:
                    check_target(inventory, dest, options.eval)
                    checked = True
                if _pass(inventory, source, dest, options, events, st, stop, trackers, status):
                    status.forget()  # news: every status line may speak again
                status.forget("failed")
            except FollowError:
                raise
            except DflashError as exc:  # a host down, a relay cut: try again next pass
                status.forget("waiting")
                status.say("failed", f"pass failed: {exc}; retrying {every}")
            if stop.is_set():
                break
            if "failed" not in status.said:
                status.say("waiting", f"waiting for new checkpoints (looking {every})")
            if sleep is not None:
                sleep(options.interval)
            else:
                stop.wait(options.interval)
    finally:
        _close(trackers)
        st.close()


__all__ = [  # the follow folder's names are re-exported: callers know follow, not its rooms
    "HISTORY",
    "PLOT",
    "follow",
    "follow_pass",
    "FollowOptions",
    "FollowEvents",
    "FollowError",
    "FollowState",
    "StatusLines",
    "read_history",
    "redraw",
    "state_dir",
]
