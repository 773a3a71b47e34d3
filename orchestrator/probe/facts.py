"""`dflash hosts check`: what each host is, gathered in parallel over SSH (or locally)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator.errors import DflashError
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport import bundle
from orchestrator.transport.hosts import open_host


@dataclass
class HostFacts:
    """One host's facts, or the one-line reason it could not be asked."""

    host: str
    facts: dict | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        return {"host": self.host, "reachable": self.ok, "error": self.error, **(self.facts or {})}


def host_facts(spec: HostSpec, inventory: Inventory | None = None) -> HostFacts:
    """Ask one host for its facts through the remote bundle."""
    try:
        with open_host(spec, inventory) as host:
            facts = bundle.run_remote_json(host, ["facts", "--workdir", host.workdir], timeout=120)
        return HostFacts(spec.name, facts=facts)
    except DflashError as exc:
        return HostFacts(spec.name, error=str(exc))


def check_hosts(inventory: Inventory, names: list[str] | None = None) -> list[HostFacts]:
    """Facts for the named hosts (all when none named), asked concurrently, in order."""
    specs = inventory.expand(names) if names else list(inventory.hosts.values())
    if not specs:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(specs))) as pool:
        return list(pool.map(lambda s: host_facts(s, inventory), specs))
