"""The follow folder: what ``dflash follow`` remembers across passes (docs/follow.md)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.inventory import Inventory
from orchestrator.results import plots
from orchestrator.results import store as results
from orchestrator.results.store import results_dir
from remote.atomic import write_json_atomic
from remote.protocol.metrics import upgrade

STATE_FORMAT = "dflash-follow/1"
HISTORY = "history.json"
STATE = "state.json"
PLOT = "tau_by_step.png"


class FollowError(DflashError):
    """Follow cannot run (another follower holds the folder, bad hosts)."""


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except ValueError as exc:
        raise FollowError(f"{path} is not valid JSON ({exc}); fix or remove it") from None


def state_dir(inventory: Inventory, source: str, dest: str, options: Any = None) -> Path:
    """The follow folder of a source/destination pair (`options`: a `FollowOptions`)."""
    if options is not None and options.state_dir:
        return Path(options.state_dir)
    where = options.results_dir if options is not None else None
    return results_dir(inventory, where) / "follow" / f"{source}-to-{dest}"


def read_history(folder: str | os.PathLike) -> list[dict]:
    """A follow folder's entries in order, old metric names read as the registry's."""
    entries = _read_json(Path(folder) / HISTORY, [])
    return [upgrade(e) if isinstance(e, dict) else e for e in entries]


class FollowState:
    """The follow folder, held under an exclusive lock while a follower runs."""

    def __init__(self, folder: Path, source: str, dest: str):
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / "lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "?"
            self._lock.close()
            raise FollowError(
                f"another dflash follow (pid {holder}) is using {self.dir}; stop it first"
            ) from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        self.history: list[dict] = read_history(self.dir)
        state = _read_json(self.dir / STATE, {})
        if state and state.get("format") != STATE_FORMAT:
            raise FollowError(
                f"{self.dir / STATE} has format {state.get('format')!r}, expected {STATE_FORMAT!r}"
            )
        if state and (state.get("source"), state.get("dest")) != (source, dest):
            raise FollowError(
                f"{self.dir} follows {state.get('source')} -> "
                f"{state.get('dest')}, not {source} -> {dest}; use another "
                "--state-dir"
            )
        self.source, self.dest = source, dest
        self.inflight: dict[str, dict] = dict(state.get("inflight") or {})

    def done(self) -> set[str]:
        return {h["checkpoint"] for h in self.history}

    def save_state(self) -> None:
        write_json_atomic(
            self.dir / STATE,
            {
                "format": STATE_FORMAT,
                "source": self.source,
                "dest": self.dest,
                "inflight": self.inflight,
            },
            fsync=True,
        )

    def record(self, entry: dict) -> None:
        # history first: a recorded checkpoint is never evaluated again
        self.history.append(entry)
        write_json_atomic(self.dir / HISTORY, self.history, fsync=True)
        self.inflight.pop(entry["checkpoint"], None)
        self.save_state()

    def close(self) -> None:
        self._lock.close()


def redraw(folder: Path, history: list[dict]) -> Path | None:
    """Redraw ``tau_by_step.png`` in the follow folder from the history's runs."""
    runs = []
    for h in history:
        if h.get("state") == "done" and h.get("run_dir"):
            try:
                runs.append(results.load_run(h["run_dir"]))
            except DflashError:  # a run folder removed by hand: plot the others
                continue
    return plots.plot_tau_by_step(runs, Path(folder) / PLOT) if runs else None
