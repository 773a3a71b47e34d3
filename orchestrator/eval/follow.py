"""``dflash follow``: evaluate every new checkpoint a training run writes, exactly once.

One pass (`follow_pass`):

1. Ask the trainer which checkpoints are complete (`relay.list_checkpoints`, the relay's own
   completeness rules) and keep those not yet in the history, oldest step first.
2. Per checkpoint: relay it (`relay.relay`, verified, atomically published; a re-run skips
   what already arrived), optionally check it fits the target (`probe.probe_structure`),
   then evaluate it (`remote_eval.run_eval`) with the inventory's defaults, and append one
   entry to the history and redraw the tau-per-step plot. With ``keep``, a second relay
   call (nothing left to send) lets the relay prune the eval host to the newest K.

`follow` repeats passes every ``interval`` seconds until stopped.

State lives on disk in the follow folder (default ``<results_dir>/follow/<from>-to-<to>/``):
``history.json`` (one entry per evaluated checkpoint), ``state.json`` (the evaluation in
flight: checkpoint and job id), ``tau_by_step.png`` and a lock file (one follower per
folder). With ``tensorboard``/``wandb`` set, each recorded run is also logged there at its
training step (`orchestrator.results.export`; W&B's offline files go under ``<folder>/wandb``).
The job id is chosen and saved BEFORE the job starts, so a restart after any crash knows
what happened:

- crash during the relay: nothing was published (the relay publishes by one rename); the
  next pass relays again, resuming the partial files;
- crash after the job started (or while it ran): the saved job is still on the host; the
  next pass attaches to it (or pulls it, if it finished) instead of starting another;
- crash after the eval, before the history was written: the job is ``done``; the next pass
  pulls its results again and records them;
- saved job that never started, failed, was cancelled or was lost: it is started afresh.

History is written before state, so a checkpoint in the history is never evaluated again.
Ctrl-C (`KeyboardInterrupt`) stops the relay's streams (partial data stays hidden for the
next resume) or cancels the running job on the eval host, then re-raises.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval import run as remote_eval
from orchestrator.inventory import Inventory
from orchestrator.probe.structure import probe_structure
from orchestrator.relay import run as relay
from orchestrator.results import export, plots
from orchestrator.results import store as results
from orchestrator.transport.hosts import open_host
from remote.atomic import write_json_atomic

STATE_FORMAT = "dflash-follow/1"
HISTORY = "history.json"
STATE = "state.json"
PLOT = "tau_by_step.png"


class FollowError(DflashError):
    """Follow cannot run (another follower holds the folder, bad hosts)."""


@dataclass
class FollowOptions:
    """How to follow. `eval` holds the evaluation options (defaults: the inventory's)."""

    keep: int | None = None
    interval: float = 60.0
    probe: bool = False
    eval: remote_eval.EvalOptions = field(default_factory=remote_eval.EvalOptions)
    results_dir: str | os.PathLike | None = None
    state_dir: str | os.PathLike | None = None
    tensorboard: str | os.PathLike | None = None  # log folder
    wandb: str | None = None  # project

    def __post_init__(self) -> None:
        """Refuse a count no follow can run with before anything connects (the eval's own
        options check themselves)."""
        if self.keep is not None and (
            isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1
        ):
            raise DflashError(f"--keep must be a whole number of at least 1, got {self.keep!r}")
        if not self.interval > 0:
            raise DflashError(f"--interval must be more than 0 seconds, got {self.interval!r}")


class FollowEvents:
    """What follow reports while it works; the CLI draws it, tests hook into it."""

    def message(self, text: str) -> None:
        pass

    def relay_progress(self, checkpoint: str) -> relay.Progress | None:
        return None

    def eval_event(self, checkpoint: str, event: dict) -> None:
        pass

    def recorded(self, entry: dict) -> None:
        pass


# ---- state on disk -------------------------------------------------------------------------


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except ValueError as exc:
        raise FollowError(f"{path} is not valid JSON ({exc}); fix or remove it") from None


def state_dir(
    inventory: Inventory, source: str, dest: str, options: FollowOptions | None = None
) -> Path:
    """The follow folder of a source/destination pair."""
    options = options or FollowOptions()
    if options.state_dir:
        return Path(options.state_dir)
    return (
        remote_eval.results_dir(inventory, options.results_dir) / "follow" / f"{source}-to-{dest}"
    )


def read_history(folder: str | os.PathLike) -> list[dict]:
    """The entries recorded in a follow folder, in the order they were evaluated."""
    return _read_json(Path(folder) / HISTORY, [])


class _State:
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
        # History first: once a checkpoint is there it is never evaluated again, whatever
        # happens before the in-flight note is cleared.
        self.history.append(entry)
        write_json_atomic(self.dir / HISTORY, self.history, fsync=True)
        self.inflight.pop(entry["checkpoint"], None)
        self.save_state()

    def close(self) -> None:
        self._lock.close()


# ---- one checkpoint ------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _entry(
    name: str, step: int | None, host: str, job_id: str, run_dir: Path, probe: dict | None
) -> dict:
    s = results.summary(results.load_run(run_dir))
    return {
        "step": step,
        "checkpoint": name,
        "state": "done",
        "tau": s["tau"],
        "tau_tokens": s["tau_tokens"],
        "ddtree": s["ddtree"],
        "target_agreement": s["target_agreement"],
        "samples": s["samples"],
        "run_id": s["run_id"],
        "run_dir": str(run_dir),
        "job_id": job_id,
        "host": host,
        "drafter_fits": None if probe is None else probe.get("ok"),
        "time": _now(),
    }


def _failed(
    name: str,
    step: int | None,
    host: str,
    job_id: str | None,
    error: str,
    probe: dict | None = None,
) -> dict:
    return {
        "step": step,
        "checkpoint": name,
        "state": "failed",
        "error": error,
        "job_id": job_id,
        "host": host,
        "drafter_fits": None if probe is None else probe.get("ok"),
        "time": _now(),
    }


def _saved_job_state(inventory: Inventory, dest: str, job_id: str) -> str | None:
    """The state of a saved job on the eval host; None when the host has no such job."""
    with open_host(inventory.host(dest), inventory) as host:
        try:
            return remote_eval.job_status(host, job_id)["state"]
        except RemoteCommandError as exc:
            if "no job" in str(exc):
                return None
            raise


def _cancel(inventory: Inventory, dest: str, job_id: str) -> None:
    with open_host(inventory.host(dest), inventory) as host:
        try:
            remote_eval.cancel(host, job_id)
        except RemoteCommandError as exc:
            if "no job" not in str(exc):  # never started: nothing to stop
                raise


class _Follower:
    def __init__(
        self,
        inventory: Inventory,
        source: str,
        dest: str,
        options: FollowOptions,
        events: FollowEvents,
        trackers: list[export.Tracker] | None = None,
    ):
        self.inv, self.source, self.dest = inventory, source, dest
        self.opts, self.events = options, events
        self.results = remote_eval.results_dir(inventory, options.results_dir)
        self.trackers = trackers or []

    def process(
        self, st: _State, name: str, step: int | None, on_trainer: bool = True
    ) -> dict | None:
        """Relay, (probe,) evaluate and record one checkpoint; returns its history entry
        (None when a saved evaluation cannot be resumed and the trainer no longer has the
        checkpoint)."""
        saved = st.inflight.get(name)
        if saved:
            state = _saved_job_state(self.inv, self.dest, saved["job_id"])
            # running/done: attach or pull; failed: attach records the failure (a failed
            # eval is not retried); never started, cancelled or lost: evaluate afresh.
            if state in ("running", "done", "failed"):
                self.events.message(
                    f"{name}: job {saved['job_id']} from an earlier follow "
                    f"is {state}; attaching to it"
                )
                return self._attach(st, name, step, saved["job_id"], saved.get("probe"))
            if not on_trainer:
                self.events.message(
                    f"{name}: job {saved['job_id']} from an earlier follow "
                    f"is {state or 'not on the host'} and the trainer no "
                    "longer has the checkpoint; dropping it"
                )
                st.inflight.pop(name)
                st.save_state()
                return None
            self.events.message(
                f"{name}: job {saved['job_id']} from an earlier follow is "
                f"{state or 'not on the host'}; evaluating afresh"
            )
        self.events.message(f"{name}: relaying {self.source} -> {self.dest}")
        report = relay.relay(
            self.inv,
            self.source,
            [self.dest],
            relay.RelayOptions(names=[name]),
            self.events.relay_progress(name),
        )
        if not report.ok:
            _, host, error = report.failures[0]
            raise DflashError(f"relay of {name} to {host} failed: {error}")
        probe = self._probe(name) if self.opts.probe else None
        job_id = remote_eval.new_job_id(name)
        if probe is not None and not probe["ok"]:
            entry = _failed(
                name,
                step,
                self.dest,
                None,
                "drafter does not fit the target: " + "; ".join(probe.get("problems") or []),
                probe,
            )
            st.record(entry)
            return entry
        st.inflight[name] = {"job_id": job_id, "step": step, "probe": probe, "saved": _now()}
        st.save_state()  # before the job exists: a restart finds it by this id
        return self._evaluate(st, name, step, job_id, probe)

    def _probe(self, name: str) -> dict:
        spec = self.inv.host(self.dest)
        target = self.opts.eval.target or (spec.eval.target_model if spec.eval else None)
        if not target:
            raise DflashError(f"host {self.dest} has no target_model to probe against")
        with open_host(spec, self.inv) as host:
            drafter = remote_eval.resolve_checkpoint(host, spec, name)
            report = probe_structure(host, target, drafter=drafter)
        d = report.get("drafter") or {}
        self.events.message(
            f"{name}: probe-structure: {report.get('built_class')}, "
            f"{report['text'].get('num_layers', '?')} text layers; drafter "
            f"{'fits' if d.get('ok') else 'does NOT fit'}"
        )
        return {
            "ok": bool(d.get("ok")),
            "problems": d.get("problems") or [],
            "model_class": report.get("built_class"),
        }

    def _evaluate(
        self, st: _State, name: str, step: int | None, job_id: str, probe: dict | None
    ) -> dict:
        self.events.message(f"{name}: evaluating on {self.dest} (job {job_id})")
        try:
            run_dir = remote_eval.run_eval(
                self.inv,
                self.dest,
                name,
                self.opts.eval,
                dest=self.results,
                job_id=job_id,
                on_event=lambda ev: self.events.eval_event(name, ev),
            )
        except KeyboardInterrupt:
            self._interrupted(st, name, job_id)
            raise
        except remote_eval.JobError as exc:  # the eval itself failed: recorded, not retried
            entry = _failed(name, step, self.dest, job_id, str(exc), probe)
            st.record(entry)
            return entry
        return self._record(st, name, step, job_id, run_dir, probe)

    def _attach(
        self, st: _State, name: str, step: int | None, job_id: str, probe: dict | None
    ) -> dict:
        try:
            run_dir = remote_eval.attach(
                self.inv,
                self.dest,
                job_id,
                dest=self.results,
                on_event=lambda ev: self.events.eval_event(name, ev),
            )
        except KeyboardInterrupt:
            self._interrupted(st, name, job_id)
            raise
        except remote_eval.JobError as exc:
            entry = _failed(name, step, self.dest, job_id, str(exc), probe)
            st.record(entry)
            return entry
        return self._record(st, name, step, job_id, run_dir, probe)

    def _track(self, run_dir: Path) -> None:
        """Log the run to the trackers; a tracker failing never loses the result."""
        for tracker in self.trackers:
            try:
                tracker.log(results.load_run(run_dir))
            except Exception as exc:  # the history already holds the result
                self.events.message(f"{type(tracker).__name__} could not log {run_dir.name}: {exc}")

    def _interrupted(self, st: _State, name: str, job_id: str) -> None:
        self.events.message(f"{name}: interrupted; cancelling job {job_id} on {self.dest}")
        _cancel(self.inv, self.dest, job_id)
        st.inflight.pop(name, None)
        st.save_state()

    def _record(
        self,
        st: _State,
        name: str,
        step: int | None,
        job_id: str,
        run_dir: Path,
        probe: dict | None,
    ) -> dict:
        entry = _entry(name, step, self.dest, job_id, run_dir, probe)
        st.record(entry)
        redraw(st.dir, st.history)
        self._track(run_dir)
        if self.opts.keep is not None:
            # Nothing left to send: the relay only prunes the eval host to the newest K.
            try:
                report = relay.relay(
                    self.inv,
                    self.source,
                    [self.dest],
                    relay.RelayOptions(names=[name], keep=self.opts.keep),
                )
            except DflashError as exc:  # e.g. the trainer already deleted it: next time
                self.events.message(f"not pruned this time: {exc}")
                return entry
            gone = report.pruned.get(self.dest) or []
            if gone:
                self.events.message(
                    f"kept the newest {self.opts.keep} on {self.dest}; removed {', '.join(gone)}"
                )
        return entry


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


# ---- entry points --------------------------------------------------------------------------


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
    """One pass: evaluate every complete checkpoint not yet in the history (an evaluation
    left in flight by an earlier follower first). Returns the entries recorded."""
    options = options or FollowOptions()
    events = events or FollowEvents()
    _check_hosts(inventory, source, dest)
    st = _State(state_dir(inventory, source, dest, options), source, dest)
    trackers: list[export.Tracker] = []
    try:
        trackers = open_trackers(options, st.dir)
        return _pass(inventory, source, dest, options, events, st, stop, trackers)
    finally:
        _close(trackers)
        st.close()


def open_trackers(options: FollowOptions, folder: Path) -> list[export.Tracker]:
    """The trackers `options` asks for (a missing library is one clear error, raised
    before any checkpoint is touched)."""
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


def _pass(
    inventory,
    source,
    dest,
    options,
    events,
    st: _State,
    stop: threading.Event | None,
    trackers: list[export.Tracker],
) -> list[dict]:
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
        events.message(f"not complete yet: {', '.join(waiting)}")
    # In-flight first (its job may be running now), then oldest step first.
    todo.sort(key=lambda sn: (sn[1] not in st.inflight, sn[0] if sn[0] is not None else -1, sn[1]))
    follower = _Follower(inventory, source, dest, options, events, trackers)
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
    """Run passes every ``options.interval`` seconds until `stop` is set (or Ctrl-C). The
    follow folder stays locked throughout, so a second follower is refused."""
    options = options or FollowOptions()
    events = events or FollowEvents()
    stop = stop or threading.Event()
    _check_hosts(inventory, source, dest)
    st = _State(state_dir(inventory, source, dest, options), source, dest)
    trackers: list[export.Tracker] = []
    try:
        trackers = open_trackers(options, st.dir)
        while not stop.is_set():
            try:
                _pass(inventory, source, dest, options, events, st, stop, trackers)
            except FollowError:
                raise
            except DflashError as exc:  # a host down, a relay cut: try again next pass
                events.message(f"pass failed: {exc}; retrying in {options.interval:g}s")
            if stop.is_set():
                break
            events.message(f"waiting {options.interval:g}s for new checkpoints")
            if sleep is not None:
                sleep(options.interval)
            else:
                stop.wait(options.interval)
    finally:
        _close(trackers)
        st.close()


__all__ = [
    "follow",
    "follow_pass",
    "FollowOptions",
    "FollowEvents",
    "FollowError",
    "read_history",
    "redraw",
    "state_dir",
]
