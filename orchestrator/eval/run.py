"""Remote eval from the workstation: push, preflight, start detached, watch, cancel, pull.

The everyday path is one call::

    run_eval(inventory, "ct129", "step_12000", EvalOptions(samples=20), on_event=print)

which pushes the remote bundle and the prompt set (only when the host lacks that exact
file; one round trip looks for both), starts the job detached from the SSH session
(``remote/jobs/``) whose runner first runs the host-side checks (versions, RAM, the
ground-truth server reachable FROM the host: each failure one line), streams its progress
events to `on_event` over that same SSH command, receives the job's result files at its end
on that stream too, writes them to ``<results_dir>/<job-id>/`` and draws the plots there
(matplotlib is imported while the job runs). After connecting: two SSH commands in all.

The pieces are separate so other commands (the demo, ``dflash follow``, sharding across
hosts) can reuse them: `preflight`, `start_job`, `watch`, `job_status`, `list_jobs`,
`cancel`, `pull_results`. What to evaluate (`EvalOptions`, the job spec with its typed
`EvalSpec`) is built in `orchestrator.eval.spec`; this module passes it through untouched.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval import jobwire
from orchestrator.eval.spec import (
    EvalOptions,
    build_spec,
    new_job_id,
    resolve_checkpoint,
)
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, HostError, Result, open_host
from orchestrator.transport.lines import HostLines
from remote.protocol import (
    JOB_CARRY_KEY,
    RESULT_FILES,
    TERMINAL_STATES,
    WATCH_END_EVENT,
    ResultError,
    check_files,
)
from remote.relay.fdfiles import write_new

REQUIRED_RESULT_FILES = ("result.json",)

EventHandler = Callable[[dict], None]


class JobError(DflashError):
    """A job failed, was cancelled or was lost; the message says which and why."""


@dataclass
class JobRef:
    """A started job: where it runs and how to find it again."""

    host: str
    job_id: str
    dir: str
    pid: int
    pgid: int
    bundle_pushed: bool
    spec: dict
    # `start_job(follow=True)`: the SSH command that started the job and now streams its
    # events; `watch` reads it instead of opening another.
    stream: HostLines | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "job_id": self.job_id,
            "dir": self.dir,
            "pid": self.pid,
            "pgid": self.pgid,
            "bundle_pushed": self.bundle_pushed,
        }


# ---- remote calls -----------------------------------------------------------------------


def preflight(host: Host, spec: dict, *, target_only: bool = False) -> dict:
    """Run the host-side checks for `spec` (nothing is loaded); the first failure raises
    one line. `target_only`: python, packages, the target and its tokenizer alone."""
    argv = ["preflight", "--spec", "-", *(["--target-only"] if target_only else [])]
    return bundle.run_remote_json(host, argv, payload=spec, timeout=120)


def start_job(
    host: Host,
    spec: dict,
    job_id: str | None = None,
    preflight: bool = False,
    *,
    follow: bool = False,
) -> JobRef:
    """Push the bundle if needed and start the job detached; returns at once. With
    `preflight`, the job's runner first runs the host-side checks (see `preflight`) and this
    returns when they passed: one process and one torch import for checks and job, and a
    failed check raises its one line with no job left on the host. With `follow`, the same
    SSH command then streams the job's events and, at its end, its result files
    (``ref.stream``, read by `watch`): no second command to start. No line of the host's
    answer is bigger, and no wait longer, than `jobwire` allows."""
    job_id = jobwire.local_job_id(job_id or new_job_id(spec.get("checkpoint") or "job"))
    argv = [
        *jobwire.job_argv(host, "start", job_id),
        "--spec=-",
        *(["--preflight"] if preflight else []),
        *(["--follow", "--pull"] if follow else []),
    ]
    # No round trip to look for the bundle first: the line runs it where it is there and
    # says so where it is not (`bundle.first_line`); then it is pushed and run again.
    stream, info = jobwire.call(host, "start", job_id, argv=argv, payload=spec, keep=follow)
    return JobRef(
        host=host.name,
        job_id=job_id,
        dir=info["dir"],
        pid=info["pid"],
        pgid=info["pgid"],
        bundle_pushed=bundle.was_pushed(host),
        spec={k: v for k, v in spec.items() if k != JOB_CARRY_KEY},
        stream=stream,
    )


def job_status(host: Host, job_id: str) -> dict:
    """The job's state (`remote.protocol.JOB_STATES`) and last progress event, checked."""
    return jobwire.call(host, "status", jobwire.local_job_id(job_id))[1]


def list_jobs(host: Host) -> list[dict]:
    """Every job on the host, oldest first, with its state (each row checked)."""
    return jobwire.call(host, "list")[1]


def cancel(host: Host, job_id: str) -> dict:
    """Stop the job and all its processes (its process group), waiting until none is left."""
    return jobwire.call(host, "cancel", jobwire.local_job_id(job_id))[1]


# How a watch's end line begins (`remote.jobs.watch.watch` writes it with json.dumps): that one
# line may be as long as the result files it carries.
_END_PREFIX = json.dumps({"event": WATCH_END_EVENT})[:-1].encode()


def watch(
    host: Host,
    job_id: str,
    on_event: EventHandler | None = None,
    offset: int = 0,
    *,
    stream: HostLines | None = None,
    pull: bool = False,
) -> dict:
    """Stream the job's progress events (from byte `offset`) to `on_event` until it ends.

    Returns the final ``watch_end`` event: ``{"state", "exit", "has_result", "offset",
    "dir"}``, with `pull` (and always from a `start_job(follow=True)` stream, passed as
    `stream`) also ``"files"``, the result files for `pull_results`. Each event is checked
    (`remote.protocol.JOB_EVENT_FIELDS`) before `on_event` sees it. A dropped connection,
    or a host silent for `jobwire.WATCH_SILENCE_SECONDS` (its watch sends a heartbeat every
    few seconds), raises `HostError` saying how to re-attach; the job goes on.
    """
    job_id = jobwire.local_job_id(job_id)
    lines = stream
    if lines is None:
        argv = jobwire.job_argv(host, "watch", job_id) + ["--offset", str(offset)]
        proc = host.popen(bundle.remote_command(host, argv + (["--pull"] if pull else [])))
        proc.close_stdin()
        lines = HostLines(host.name, proc, "job watch", limit=jobwire.EVENT_MAX)
    lines.what = f"job watch of {job_id}"
    lines.hint = f"it keeps running: dflash remote-eval --attach {job_id}"
    lines.bound(silence=jobwire.WATCH_SILENCE_SECONDS)
    end: dict | None = None
    try:
        while end is None:
            raw = lines.line(jobwire.EVENT_MAX, longer=(_END_PREFIX, jobwire.RESULT_MAX))
            if not raw.endswith(b"\n"):
                break  # the stream ended (a line cut short is no event)
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("event") == "heartbeat":
                continue
            if event.get("event") == WATCH_END_EVENT:
                end = jobwire.checked(host, "watch_end", event)
                break
            jobwire.checked(host, "event", event)
            if on_event:
                on_event(event)
        code = lines.wait()
    except (OSError, EOFError) as exc:
        lines.kill()
        raise HostError(
            f"{host.name}: lost the connection while watching job {job_id} "
            f"({exc}); it keeps running: dflash remote-eval --attach {job_id}"
        ) from None
    except BaseException:
        lines.kill()
        raise
    lines.close()
    if end is None:
        if code not in (0, -1):  # the remote command itself failed (e.g. no such job)
            bundle.check_result(host, Result("", lines.proc.stderr(), code), ["job watch"])
        raise HostError(
            f"{host.name}: lost the connection while watching job {job_id}; it "
            f"keeps running: dflash remote-eval --attach {job_id}"
        )
    return end


def pull_results(host: Host, job_id: str, dest: str | os.PathLike, end: dict | None = None) -> Path:
    """Copy the job's result files into ``dest/<job-id>/`` (replaced as a whole, through a
    hidden partial folder, so a reader never sees half a run). Returns that folder. The
    files come from `end` (a `watch` end that carries them) or else in one SSH command
    (``job pull``: the state and every file at once). The job id is checked as the host
    checks it before it names a folder here, and no write follows a symlink."""
    job_id = jobwire.local_job_id(job_id)
    status = end if end is not None and "files" in end else None
    if status is None:
        status = jobwire.call(host, "pull", job_id)[1]
    if not status.get("has_result"):
        error = (status.get("exit") or {}).get("error")
        raise JobError(
            f"job {job_id} on {host.name} has no result to pull (state "
            f"{status.get('state')}{': ' + error if error else ''})"
        )
    files = decode_files(host, job_id, status.get("files"))
    pulled = {
        "host": host.name,
        "job_id": job_id,
        "remote_dir": str(status.get("dir") or ""),
        "pulled": time.time(),
    }
    files["pulled.json"] = json.dumps(pulled, indent=2).encode()
    dest = Path(dest)
    final = dest / job_id
    partial = dest / f".{job_id}.partial-{os.getpid()}"
    _remove(partial)
    dest.mkdir(parents=True, exist_ok=True)
    partial.mkdir()
    try:
        folder = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for name, data in files.items():
                write_new(folder, name, data, fsync=False)
        finally:
            os.close(folder)
        _remove(final)
        os.replace(partial, final)
    finally:
        _remove(partial)
    return final


def _remove(path: Path) -> None:
    """Remove `path` if anything is there: a link itself (never what it points to), or a
    folder with what it holds."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def decode_files(
    host: Host, job_id: str, files: object, required: Sequence[str] = REQUIRED_RESULT_FILES
) -> dict[str, bytes]:
    """The host's ``{name: base64}`` (a watch's end with ``--pull``), checked: only known
    result file names (a host cannot name a path), valid base64, every `required` file
    there, and the JSON types inside them (`remote.protocol.check_files`)."""
    if not isinstance(files, dict):
        raise RemoteCommandError(f"{host.name}: job {job_id}: the pull carried no files")
    out = {}
    for name in RESULT_FILES:
        if name not in files:
            continue
        try:
            out[name] = base64.b64decode(files[name], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise RemoteCommandError(
                f"{host.name}: job {job_id}: {name} arrived garbled (not base64)"
            ) from None
    for name in required:
        if name not in out:
            raise HostError(f"{host.name}: could not read {name} of job {job_id}")
    try:
        check_files(out)
    except ResultError as exc:
        raise RemoteCommandError(f"{host.name}: job {job_id}: {exc}; nothing was pulled") from None
    return out


def finish_local(run_dir: Path) -> Path:
    """After a pull: draw the plots beside the JSON (best effort: a plotting problem never
    loses a result)."""
    try:
        from orchestrator.results import plots
        from orchestrator.results import store as results

        run = results.load_run(run_dir)
        plots.plot_run(run, run_dir)
        plots.plot_tau_by_step(
            results.list_runs(run_dir.parent), run_dir.parent / "tau_by_step.png"
        )
    except Exception as exc:  # plots are a convenience; the JSON is the result
        (run_dir / "plots-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
    return run_dir


_warming: threading.Thread | None = None
_warming_lock = threading.Lock()


def warm_plots() -> threading.Thread:
    """Import matplotlib in the background while a job runs, so `finish_local` does not
    wait for it at the end (the watcher is idle until then). Once per process: a later call
    returns the same (daemon) thread."""
    global _warming

    def work() -> None:
        try:
            from orchestrator.results import plots

            plots.warm()
        except Exception:  # finish_local reports plotting problems; nothing to do here
            pass

    with _warming_lock:
        if _warming is None:
            _warming = threading.Thread(target=work, name="warm-plots", daemon=True)
            _warming.start()
        return _warming


def results_dir(inventory: Inventory, override: str | os.PathLike | None = None) -> Path:
    """The local results folder: `override` (a command-line path: relative to the current
    folder) or the inventory's ``defaults.results_dir``, relative to the inventory file's
    folder, so every command finds the same folder wherever it is started."""
    if override:
        return Path(override)
    path = Path(inventory.defaults.results_dir or "results").expanduser()
    return path if path.is_absolute() else Path(inventory.path).parent / path


def eval_host_name(inventory: Inventory, host_name: str | None) -> str:
    name = host_name or inventory.defaults.eval_host
    if not name:
        eval_hosts = [h.name for h in inventory.hosts.values() if h.eval]
        if len(eval_hosts) == 1:
            return eval_hosts[0]
        raise DflashError("no eval host: pass --host or set defaults.eval_host in the inventory")
    if name in inventory.groups:
        members = inventory.groups[name]
        if len(members) != 1:
            raise DflashError(
                f"{name!r} is a group of {len(members)} hosts; name one host, "
                f"or shard across them with --hosts {name}"
            )
        name = members[0]
    inventory.host(name)
    return name


def attach(
    inventory: Inventory,
    host_name: str | None,
    job_id: str,
    *,
    on_event: EventHandler | None = None,
    dest: str | os.PathLike | None = None,
    host: Host | None = None,
    ref: JobRef | None = None,
) -> Path:
    """Watch an existing job to its end, then pull its results; returns the local folder.
    `ref`: the job was just started here (`start_job(follow=True)`): its stream is read,
    with no separate state check or pull."""
    job_id = jobwire.local_job_id(job_id)  # it names a folder here: checked before connecting
    name = eval_host_name(inventory, host_name)
    own = host is None
    host = host or open_host(inventory.host(name), inventory)
    warm_plots()
    try:
        if ref is not None and ref.stream is not None:
            end = watch(host, job_id, on_event, stream=ref.stream)
        else:
            status = job_status(host, job_id)
            end = (
                status
                if status["state"] in TERMINAL_STATES and status["state"] != "done"
                else watch(host, job_id, on_event, pull=True)
            )
        if end["state"] != "done":
            err = (end.get("exit") or {}).get("error")
            raise JobError(
                f"job {job_id} on {name} {end['state']}"
                f"{': ' + err if err else ''} (log: dflash jobs --host {name})"
            )
        return finish_local(pull_results(host, job_id, results_dir(inventory, dest), end))
    finally:
        if own:
            host.close()


def run_eval(
    inventory: Inventory,
    host_name: str | None,
    checkpoint: str,
    options: EvalOptions | None = None,
    *,
    on_event: EventHandler | None = None,
    dest: str | os.PathLike | None = None,
    job_id: str | None = None,
    on_start: Callable[[JobRef], None] | None = None,
) -> Path:
    """Evaluate `checkpoint` on the eval host in one call: push, preflight, start detached,
    watch, pull. Returns the local results folder ``<results_dir>/<job-id>``."""
    options = options or EvalOptions()
    name = eval_host_name(inventory, host_name)
    spec = inventory.host(name)
    with open_host(spec, inventory) as host:
        # matplotlib is imported while the host's runner imports torch (seconds of one
        # core's work), not after the pull; but only once logged in: its import holds the
        # GIL that paramiko's handshake needs (a 0.2 s login took 0.6 s beside it).
        host.connect()
        warm_plots()
        ref = _start(host, spec, checkpoint, options, job_id, follow=True)
        if on_start:
            on_start(ref)
        return attach(inventory, name, ref.job_id, on_event=on_event, dest=dest, host=host, ref=ref)


def start_eval(
    inventory: Inventory,
    host_name: str | None,
    checkpoint: str,
    options: EvalOptions | None = None,
    *,
    job_id: str | None = None,
) -> JobRef:
    """The first half of `run_eval`: push, preflight and start the job detached, then
    return; watch it later with `attach` (``dflash remote-eval --detach``)."""
    options = options or EvalOptions()
    name = eval_host_name(inventory, host_name)
    spec = inventory.host(name)
    with open_host(spec, inventory) as host:
        return _start(host, spec, checkpoint, options, job_id)


def _start(
    host: Host,
    spec: HostSpec,
    checkpoint: str,
    options: EvalOptions,
    job_id: str | None,
    follow: bool = False,
) -> JobRef:
    # Small inputs (the prompts) travel inside the job start: one SSH command in all.
    job = build_spec(host, spec, checkpoint, options, carry=[])
    return start_job(host, job, job_id, preflight=True, follow=follow)


__all__ = [
    "EvalOptions",  # built in orchestrator.eval.spec; callers of run_eval find it here too
    "JobError",
    "JobRef",
    "attach",
    "build_spec",
    "cancel",
    "eval_host_name",
    "finish_local",
    "job_status",
    "list_jobs",
    "new_job_id",
    "preflight",
    "pull_results",
    "resolve_checkpoint",
    "results_dir",
    "run_eval",
    "start_eval",
    "start_job",
    "watch",
]
