"""Remote eval from the workstation, the everyday path: start, watch, pull (docs/eval.md)."""

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
    """Watch a job to its end and pull its results (`ref`: its follow stream is read); the
    local folder. `required` and `check` are `pull.pull_results`'s."""
    job_id = jobwire.local_job_id(job_id)
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
    """Evaluate `checkpoint` on the eval host in one call; the folder ``<results_dir>/<job-id>``."""
    options = options or EvalOptions()
    name = eval_host_name(inventory, host_name)
    spec = inventory.host(name)
    with open_host(spec, inventory) as host:
        # matplotlib loads during the host's torch import, after login: it holds the GIL
        # paramiko's handshake needs
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
    """`run_eval` up to the detached start (``--detach``); `attach` watches it later."""
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
    job = build_spec(host, spec, checkpoint, options, carry=[])
    return start_job(host, job, job_id, preflight=True, follow=follow)


__all__ = [
    "EvalOptions",
    "attach",
    "build_spec",
    "eval_host_name",
    "new_job_id",
    "resolve_checkpoint",
    "run_eval",
    "start_eval",
]
