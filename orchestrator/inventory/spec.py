"""What an inventory says: its hosts, their roles and the defaults, as dataclasses."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.errors import DflashError
from orchestrator.slurm.role import SlurmRole
from remote.online.spec import ServeSpec
from remote.protocol import (
    DEFAULT_DRAFT_POLICY,
    DEFAULT_DTYPE,
    GT_DEFAULT_CONCURRENCY,
    GT_DEFAULT_DEADLINE,
    GT_DEFAULT_MAX_NEW_TOKENS,
    GT_DEFAULT_PHASE_DEADLINE,
    GT_DEFAULT_TIMEOUT,
    JobSpec,
)


class InventoryError(DflashError):
    """The inventory file is missing or malformed; the message names file, line and key."""


@dataclass
class TrainerRole:
    checkpoints: str
    complete_rule: str = "auto"
    marker: str = "COMPLETE"
    stable_seconds: float = 2.0


@dataclass
class _EvalRoleOwn:
    # The engine's `EvalSpec` settings this role sets where an eval's options do not.
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("dtype", "threads", "draft_policy")
    # The sampling an eval's flags override one by one (docs/inventory.md).
    SAMPLING_KEYS: ClassVar[tuple[str, ...]] = ("temperature", "top_k", "top_p", "gt_samples")

    drafters: str
    target_model: str | None = None
    ground_truth: str | None = None
    ground_truth_kind: str | None = None
    prompts: str | None = None
    threads: int | None = None
    dtype: str = DEFAULT_DTYPE
    ground_truth_model: str | None = None
    max_new_tokens: int = GT_DEFAULT_MAX_NEW_TOKENS
    ground_truth_concurrency: int = GT_DEFAULT_CONCURRENCY
    ground_truth_timeout: float = GT_DEFAULT_TIMEOUT
    ground_truth_deadline: float = GT_DEFAULT_DEADLINE
    ground_truth_phase_deadline: float = GT_DEFAULT_PHASE_DEADLINE
    samples: int | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    gt_samples: int | None = None
    draft_policy: str = DEFAULT_DRAFT_POLICY
    reserve: int | str | None = None
    serve: ServeSpec | None = None


# Its own settings and the job settings a role sets, declared once in the contract.
EvalRole = make_dataclass(
    "EvalRole",
    [(name, Any, field(default=default)) for name, default in JobSpec.ROLE_SETTINGS.items()],
    bases=(_EvalRoleOwn,),
)


@dataclass
class HostSpec:
    name: str
    transport: str = "ssh"
    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    jump: str | None = None
    python: str | None = None  # None: `default_python`
    workdir: str = "~/.dflash"
    identity_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    connect_timeout: float = 10.0
    trainer: TrainerRole | None = None
    eval: EvalRole | None = None
    slurm: SlurmRole | None = None

    def __post_init__(self) -> None:
        if self.python is None:
            self.python = default_python(self.transport)


def default_python(transport: str) -> str:
    """A host's python when its entry names none: ``python3``, or on a local host the one
    running dflash, which has what dflash was installed with (a venv's torch)."""
    if transport == "local" and sys.executable:
        return sys.executable
    return "python3"


@dataclass
class Defaults:
    relay_from: str | None = None
    relay_to: str | None = None
    eval_host: str | None = None
    keep: int | None = None
    results_dir: str = "results"


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, HostSpec]
    groups: dict[str, list[str]] = field(default_factory=dict)
    defaults: Defaults = field(default_factory=Defaults)

    def host(self, name: str) -> HostSpec:
        """The host called `name`, or an error listing the names that exist."""
        if name not in self.hosts:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise InventoryError(f"unknown host {name!r} in {self.path} (known hosts: {known})")
        return self.hosts[name]

    def expand(self, names: list[str]) -> list[HostSpec]:
        """Host specs for names that may also be group names, in order, without repeats."""
        out: list[HostSpec] = []
        for name in names:
            members = self.groups.get(name, [name]) if name not in self.hosts else [name]
            for member in members:
                spec = self.host(member)
                if spec not in out:
                    out.append(spec)
        return out

    def listing(self) -> dict:
        """The hosts and groups as ``dflash hosts`` shows them."""
        rows = []
        for spec in self.hosts.values():
            address = (
                "local"
                if spec.transport == "local"
                else (
                    f"{spec.user + '@' if spec.user else ''}{spec.hostname or spec.name}"
                    f"{':' + str(spec.port) if spec.port else ''}"
                )
            )
            rows.append(
                {
                    "name": spec.name,
                    "transport": spec.transport,
                    "address": address,
                    "jump": spec.jump,
                    "roles": [r for r in ("trainer", "eval") if getattr(spec, r)],
                    "python": spec.python,
                    "workdir": spec.workdir,
                }
            )
        return {"inventory": str(self.path), "hosts": rows, "groups": self.groups}
