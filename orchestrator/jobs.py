"""``dflash jobs list|attach|cancel|prune``: the hosts' jobs, whatever their kind."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import job as remote_job
from orchestrator.eval import jobwire
from orchestrator.eval import run as remote_eval
from orchestrator.eval.online import run as online
from orchestrator.eval.parity import run as parity
from orchestrator.ids import resolve_id
from orchestrator.inventory import Inventory
from orchestrator.sizes import parse_age
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import JobKind


def jobs_on(inventory: Inventory, names: list[str] | None = None) -> list[dict]:
    """Every job on the named hosts or groups (default: all), one dict each with ``host`` first."""
    specs = inventory.expand(names) if names else list(inventory.hosts.values())
    rows = []
    for spec in specs:
        with open_host(spec, inventory) as h:
            # The inventory's name for the host, whatever a row claims.
            rows += [
                {"host": spec.name, **{k: v for k, v in job.items() if k != "host"}}
                for job in remote_job.list_jobs(h)
            ]
    return rows


@dataclass(frozen=True)
class Cancelled:
    """A job stopped on `host`, with the host's answer."""

    host: str
    job_id: str
    answer: dict

    def to_json(self) -> dict:
        return self.answer


def job_on(host: Host, name: str, job_id: str) -> str:
    """The whole id of the job on `host` that `job_id` names (`resolve_id`)."""
    jobs = [row["job_id"] for row in remote_job.list_jobs(host)]
    where, listed_by = f"on {name}", f"dflash jobs list --host {name}"
    return resolve_id(job_id, jobs, what="job", where=where, listed_by=listed_by)


def cancel_on(inventory: Inventory, host_name: str | None, job_id: str) -> Cancelled:
    """Stop job `job_id` on `host_name` (default: the eval host) and all it started."""
    job_id = jobwire.local_job_id(job_id)
    name = remote_eval.eval_host_name(inventory, host_name)
    with open_host(inventory.host(name), inventory) as h:
        job_id = job_on(h, name, job_id)
        return Cancelled(name, job_id, remote_job.cancel(h, job_id))


@dataclass(frozen=True)
class Attached:
    """A job watched to its end and pulled: its kind and its local run folder."""

    kind: str
    run_dir: Path


def attach_on(
    inventory: Inventory,
    host_name: str | None,
    job_id: str,
    *,
    on_event: Callable[[dict], None] | None = None,
    dest: str | os.PathLike | None = None,
) -> Attached:
    """Watch job `job_id` to its end and pull its result; a parity capture is refused."""
    job_id = jobwire.local_job_id(job_id)
    name = remote_eval.eval_host_name(inventory, host_name)
    with open_host(inventory.host(name), inventory) as host:
        job_id = job_on(host, name, job_id)
        status = remote_job.job_status(host, job_id)
        kind = status.get("kind") or JobKind.EVAL
        if kind == JobKind.EVAL:
            run_dir = remote_eval.attach(
                inventory, name, job_id, on_event=on_event, dest=dest, host=host, status=status
            )
        elif kind == JobKind.ONLINE:
            run_dir = online.attach(
                inventory, name, job_id, on_event=on_event, dest=dest, host=host, status=status
            )
        elif kind == JobKind.COMPARE:
            run_dir = parity.attach(
                inventory,
                name,
                job_id,
                on_event=(lambda _stage, ev: on_event(ev)) if on_event else None,
                dest=dest,
                host=host,
                status=status,
            )
        else:
            raise DflashError(
                f"job {job_id} on {name} is a {kind} job: one half of a parity run, which "
                "cannot be resumed alone; run dflash parity again (B's ground truth comes "
                "from its cache)"
            )
    return Attached(kind, run_dir)


@dataclass(frozen=True)
class Pruned:
    """What a prune removed from one host's workdir, or would (``dry_run``)."""

    host: str
    answer: dict

    def to_json(self) -> dict:
        return {"host": self.host, **self.answer}


def prune_on(
    inventory: Inventory,
    names: list[str] | None = None,
    older_than: str | float = "7d",
    *,
    ground_truth: bool = False,
    features: bool = False,
    dry_run: bool = False,
) -> list[Pruned]:
    """Prune finished job folders (and asked caches) older than `older_than`."""
    seconds = parse_age(older_than)
    caches = [c for c, on in (("ground-truth", ground_truth), ("features", features)) if on]
    specs = inventory.expand(names) if names else list(inventory.hosts.values())
    out = []
    for spec in specs:
        with open_host(spec, inventory) as h:
            out.append(Pruned(spec.name, remote_job.prune(h, seconds, caches, dry_run)))
    return out
