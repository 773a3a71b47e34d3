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
hosts) can reuse them: one job's calls (`preflight`, `start_job`, `watch`, `job_status`,
`list_jobs`, `cancel`) are in `orchestrator.eval.job`, the pull and the plots
(`pull_results`, `finish_local`) in `orchestrator.eval.pull`. What to evaluate
(`EvalOptions`, the job spec with its typed `EvalSpec`) is built in
`orchestrator.eval.spec`; this module passes it through untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import jobwire
from orchestrator.eval.job import EventHandler, JobRef, failure, job_status, start_job, watch
from orchestrator.eval.outline import outline_event
from orchestrator.eval.pull import REQUIRED_RESULT_FILES, finish_local, pull_results, warm_plots
from orchestrator.eval.spec import (
    EvalOptions,
    build_spec,
    new_job_id,
    resolve_checkpoint,
)
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.results.store import results_dir
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import TERMINAL_STATES, JobState


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
    status: dict | None = None,
    what: str = "job",
    required: Sequence[str] = REQUIRED_RESULT_FILES,
    check: Callable[[dict[str, bytes]], None] | None = None,
) -> Path:
    """Watch an existing job to its end, then pull its results; returns the local folder.
    `ref`: the job was just started here (`start_job(follow=True)`): its stream is read,
    with no separate state check or pull. `status`: its state, read already on `host`.
    `what` names the job in a failure; `required` and `check` are the pull's
    (`pull.pull_results`: a kind's own files, checked before anything is written)."""
    job_id = jobwire.local_job_id(job_id)  # it names a folder here: checked before connecting
    name = eval_host_name(inventory, host_name)
    own = host is None
    host = host or open_host(inventory.host(name), inventory)
    warm_plots()
    try:
        if ref is not None and ref.stream is not None:
            end = watch(host, job_id, on_event, stream=ref.stream)
        else:
            status = status or job_status(host, job_id)
            end = (
                status
                if status["state"] in TERMINAL_STATES and status["state"] != JobState.DONE
                else watch(host, job_id, on_event, pull=True)
            )
        if end["state"] != JobState.DONE:
            raise failure(what, job_id, name, end)
        dest = results_dir(inventory, dest)
        return finish_local(pull_results(host, job_id, dest, end, required=required, check=check))
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
        if on_event:
            on_event(outline_event(ref.spec, f"job {ref.job_id} on {name}"))
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
    "attach",
    "build_spec",
    "eval_host_name",
    "new_job_id",
    "resolve_checkpoint",
    "run_eval",
    "start_eval",
]
