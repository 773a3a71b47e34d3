"""`dflash hosts check`: each host's facts, asked in parallel, and what its roles need."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport import bundle
from orchestrator.transport.hosts import open_host
from remote.protocol import ENGINE_PACKAGES

# Beyond the standard library: the relay's host side is stdlib only; an eval runs the engine.
ROLE_PACKAGES: dict[str, tuple[str, ...]] = {"trainer": (), "eval": ENGINE_PACKAGES}


def roles_of(spec: HostSpec) -> list[str]:
    return [role for role in ROLE_PACKAGES if getattr(spec, role)]


def needed_packages(spec: HostSpec) -> list[str]:
    """The packages `spec`'s roles need, in `ENGINE_PACKAGES`' order."""
    needed = {p for role in roles_of(spec) for p in ROLE_PACKAGES[role]}
    return [p for p in ENGINE_PACKAGES if p in needed]


@dataclass
class HostFacts:
    """One host's facts or why it could not be asked; its roles and what they need."""

    host: str
    facts: dict | None = None
    error: str | None = None
    roles: list[str] = field(default_factory=list)
    needed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def missing(self) -> list[str]:
        found = (self.facts or {}).get("packages") or {}
        return [p for p in self.needed if self.ok and not found.get(p)]

    @property
    def problem(self) -> str | None:
        """Why the host cannot serve its roles, in one line; None when it can."""
        if not self.ok:
            return self.error
        if not self.missing:
            return None
        python = (self.facts or {}).get("python_executable") or "its python"
        roles = " and ".join(r for r in self.roles if ROLE_PACKAGES[r])
        return (
            f"{self.host}: the {roles} role needs {', '.join(self.missing)}, missing from "
            f"{python}; set 'python:' for {self.host} in the inventory to a python that has them"
        )

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "reachable": self.ok,
            "error": self.error,
            "roles": self.roles,
            "packages_needed": self.needed,
            "packages_missing": self.missing,
            **(self.facts or {}),
        }


def host_facts(spec: HostSpec, inventory: Inventory | None = None) -> HostFacts:
    """Ask one host for its facts through the remote bundle."""
    own = {"roles": roles_of(spec), "needed": needed_packages(spec)}
    try:
        with open_host(spec, inventory) as host:
            facts = bundle.run_remote_json(host, ["facts", "--workdir", host.workdir], timeout=120)
        return HostFacts(spec.name, facts=facts, **own)
    except DflashError as exc:
        return HostFacts(spec.name, error=str(exc), **own)


def check_hosts(inventory: Inventory, names: list[str] | None = None) -> list[HostFacts]:
    """Facts for the named hosts (all when none named), asked concurrently, in order."""
    specs = inventory.expand(names) if names else list(inventory.hosts.values())
    if not specs:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(specs))) as pool:
        return list(pool.map(lambda s: host_facts(s, inventory), specs))
