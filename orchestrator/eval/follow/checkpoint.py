"""One checkpoint of ``dflash follow``: relay, probe, evaluate, record (docs/follow.md)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import replace
from pathlib import Path

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval import job as remote_job
from orchestrator.eval import run as remote_eval
from orchestrator.eval.follow.options import FollowEvents, FollowOptions
from orchestrator.eval.follow.state import FollowError, FollowState, redraw
from orchestrator.eval.shards import run as shard
from orchestrator.eval.shards import slurm as slurm_eval
from orchestrator.eval.spec import (
    EvalOptions,
    build_spec,
    eval_identity,
    ground_truth_source,
    new_job_id,
    resolve_checkpoint,
    target_model,
)
from orchestrator.inventory import Inventory
from orchestrator.probe.structure import probe_structure
from orchestrator.relay import run as relay
from orchestrator.results import export, summary
from orchestrator.results import store as results
from orchestrator.results.store import results_dir
from orchestrator.transport.hosts import HostError, open_host
from remote.protocol import JOB_EVAL_KEY, JobKind, JobState
from remote.protocol import metrics as registry


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _entry(
    name: str, step: int | None, host: str, job_id: str, run_dir: Path, probe: dict | None
) -> dict:
    s = summary.summary(results.load_run(run_dir))
    return {
        "step": step,
        "checkpoint": name,
        "state": JobState.DONE,
        **{m.name: s[m.name] for m in registry.scalars()},
        "ddtree": s["ddtree"],
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
        "state": JobState.FAILED,
        "error": error,
        "job_id": job_id,
        "host": host,
        "drafter_fits": None if probe is None else probe.get("ok"),
        "time": _now(),
    }


def check_target(inventory: Inventory, dest: str, options: EvalOptions) -> None:
    """Ask the eval host once whether it can evaluate at all; a refusal is a `FollowError`
    (no later pass would fare better), an unreachable host is retried."""
    spec = inventory.host(dest)
    with open_host(spec, inventory) as host:
        try:
            engine = replace(
                options.engine_for(spec.eval), target=host.expand(target_model(spec, options))
            )
            job = {
                "kind": JobKind.EVAL,
                "host": dest,
                JOB_EVAL_KEY: engine.to_json(),
                "ground_truth": ground_truth_source(host, spec, options),
            }
            remote_job.preflight(host, job, target_only=True)
        except HostError:
            raise
        except DflashError as exc:
            raise FollowError(str(exc)) from None


def _saved_job_state(inventory: Inventory, dest: str, job_id: str) -> str | None:
    """A saved job's state on the eval host, None when gone; on a Slurm login node its arrays
    are cancelled and None says to evaluate afresh."""
    spec = inventory.host(dest)
    if spec.slurm is not None:
        slurm_eval.cancel_run(spec, inventory, job_id)
        return None
    with open_host(spec, inventory) as host:
        try:
            return remote_job.job_status(host, job_id)["state"]
        except RemoteCommandError as exc:
            if "no job" in str(exc):
                return None
            raise


def _cancel(inventory: Inventory, dest: str, job_id: str) -> None:
    with open_host(inventory.host(dest), inventory) as host:
        try:
            remote_job.cancel(host, job_id)
        except RemoteCommandError as exc:
            if "no job" not in str(exc):  # never started: nothing to stop
                raise


class CheckpointFollower:
    """Relays, probes, evaluates and records one checkpoint at a time, the same eval spec each."""

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
        self.results = results_dir(inventory, options.results_dir)
        self.trackers = trackers or []

    def process(
        self, st: FollowState, name: str, step: int | None, on_trainer: bool = True
    ) -> dict | None:
        """One checkpoint's history entry (None: a saved evaluation the trainer's gone from)."""
        saved = st.inflight.get(name)
        if saved:
            state = _saved_job_state(self.inv, self.dest, saved["job_id"])
            if state in (JobState.RUNNING, JobState.DONE, JobState.FAILED):
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
        run = self._evaluated_before(name)
        if run is not None:
            self.events.message(
                f"{name}: already evaluated with these settings (run {run.run_id} in "
                f"{self.results}); recorded from it, not evaluated again"
            )
            return self._record(st, name, step, run.run_id, run.path, None)
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
        sent = f"{report.files_sent} files, {report.bytes_sent / 2**20:.1f} MiB"
        self.events.message(f"{name}: relayed ({sent} in {report.seconds:.1f}s)")
        probe = self._probe(name) if self.opts.probe else None
        job_id = new_job_id(name)
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

    def _evaluated_before(self, name: str) -> results.Run | None:
        """The newest run of this trainer's `name` on this host with this eval spec, or None."""
        runs = [
            r
            for r in results.list_runs(self.results)
            if r.checkpoint == name and r.spec.get("host") == self.dest and self._ours(r, name)
        ]
        if not runs:
            return None
        spec = self.inv.host(self.dest)
        with open_host(spec, self.inv) as host:  # paths expand without a command
            want = eval_identity(build_spec(host, spec, name, self.opts.eval, carry=[]))
        same = [r for r in runs if eval_identity(r.spec) == want]
        return same[-1] if same else None

    def _ours(self, run: results.Run, name: str) -> bool:
        """Whether the run's drafter was relayed from this trainer's `name`, not another one."""
        source = run.drafter.get("source")
        if not isinstance(source, dict):
            return False
        path = str(source.get("path") or "")
        return source.get("host") == self.source and path.rstrip("/").rsplit("/", 1)[-1] == name

    def _probe(self, name: str) -> dict:
        self.events.message(
            f"{name}: probe-structure on {self.dest}: does the drafter fit the target? (its "
            "python and transformers start first; no weights are loaded)"
        )
        spec = self.inv.host(self.dest)
        target = target_model(spec, self.opts.eval)
        with open_host(spec, self.inv) as host:
            drafter = resolve_checkpoint(host, spec, name)
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
        self, st: FollowState, name: str, step: int | None, job_id: str, probe: dict | None
    ) -> dict:
        slurm = self.inv.host(self.dest).slurm is not None
        how = "as a Slurm job array" if slurm else "job"
        self.events.message(f"{name}: evaluating on {self.dest} ({how} {job_id})")
        try:
            if slurm:  # the arrays are named by the job id, cancelled on any way out
                run_dir = shard.run_sharded(
                    self.inv,
                    [self.dest],
                    name,
                    self.opts.eval,
                    dest=self.results,
                    run_id=job_id,
                    on_event=lambda host, ev: self.events.shard_event(name, host, ev),
                )
            else:
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
        except remote_job.JobError as exc:  # the eval itself failed: recorded, not retried
            entry = _failed(name, step, self.dest, job_id, str(exc), probe)
            st.record(entry)
            return entry
        finally:
            self._fresh_once()
        return self._record(st, name, step, job_id, run_dir, probe)

    def _fresh_once(self) -> None:
        """--fresh-ground-truth holds for the first eval only; later ones reuse what it made."""
        if self.opts.eval.fresh_ground_truth:
            self.opts.eval = replace(self.opts.eval, fresh_ground_truth=False)

    def _attach(
        self, st: FollowState, name: str, step: int | None, job_id: str, probe: dict | None
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
        except remote_job.JobError as exc:
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

    def _interrupted(self, st: FollowState, name: str, job_id: str) -> None:
        if self.inv.host(self.dest).slurm is not None:  # the array stopped itself already
            self.events.message(f"{name}: interrupted; Slurm arrays of {job_id} cancelled")
        else:
            self.events.message(f"{name}: interrupted; cancelling job {job_id} on {self.dest}")
            _cancel(self.inv, self.dest, job_id)
        st.inflight.pop(name, None)
        st.save_state()

    def _record(
        self,
        st: FollowState,
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
            # nothing left to send: the relay only prunes to the newest K
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
