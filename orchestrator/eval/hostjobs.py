"""The jobs of the inventory's hosts, by host name: list them across hosts, cancel one
(``dflash jobs``, ``dflash remote-eval --cancel``, ``dflash parity --cancel``)."""

from __future__ import annotations

from orchestrator.eval import job as remote_job
from orchestrator.inventory import Inventory
from orchestrator.transport.hosts import open_host


def jobs_on(inventory: Inventory, names: list[str] | None = None) -> list[dict]:
    """Every job on the named hosts or groups, one dict per job with its ``host`` first, hosts
    in order and each host's jobs oldest first. Default: every host in the inventory, since
    any host can run jobs (an eval host its evals, either host of ``parity`` its captures,
    a trainer included)."""
    specs = inventory.expand(names) if names else list(inventory.hosts.values())
    rows = []
    for spec in specs:
        with open_host(spec, inventory) as h:
            # the host's name as the inventory says it, whatever a row claims
            rows += [
                {"host": spec.name, **{k: v for k, v in job.items() if k != "host"}}
                for job in remote_job.list_jobs(h)
            ]
    return rows


def cancel_on(inventory: Inventory, host_name: str, job_id: str) -> dict:
    """Stop job `job_id` on host `host_name` and every process it started; its answer
    (``job_id``, ``state``, ``was``, ``killed``)."""
    with open_host(inventory.host(host_name), inventory) as h:
        return remote_job.cancel(h, job_id)
