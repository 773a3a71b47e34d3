"""The inventory: which hosts exist, how to reach them, and what each is for (docs/inventory.md).

A setting is one line in a key table and one field on its dataclass; a job setting an eval
role sets is declared in the contract alone (`remote.protocol.job_spec.setting`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from orchestrator.errors import DflashError
from orchestrator.sizes import parse_size
from orchestrator.slurm.role import SlurmError, SlurmRole
from remote.online.spec import ServeError, ServeSpec
from remote.protocol import (
    COUNT,
    DEFAULT_DTYPE,
    DTYPES,
    FLAG,
    GT_DEFAULT_CONCURRENCY,
    GT_DEFAULT_DEADLINE,
    GT_DEFAULT_MAX_NEW_TOKENS,
    GT_DEFAULT_PHASE_DEADLINE,
    GT_DEFAULT_TIMEOUT,
    TEXT,
    Check,
    GroundTruthSpec,
    JobSpec,
    Sampling,
    is_int,
    is_number,
    one_of,
)

ENV_VAR = "DFLASH_INVENTORY"
DEFAULT_FILE = "inventory.yaml"
EXAMPLE_FILE = "inventory.example.yaml"


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
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("dtype", "threads")

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


# The contract's checks for what a job carries, so a value accepted here is one the host
# accepts; the inventory's own for the rest.
_POSITIVE = Check("a positive number", lambda v: is_number(v) and v > 0)
_PORT = Check("a port number (1-65535)", lambda v: is_int(v) and 1 <= v <= 65535)


def _is_size(v: Any) -> bool:
    if isinstance(v, str):
        try:
            parse_size(v)
        except DflashError:
            return False
        return True
    return is_int(v) and v >= 0


_SIZE = Check("a size in bytes or like 500M, 10G, 1.5TiB", _is_size)
_GT = GroundTruthSpec.CHECKS

HOST_KEYS: dict[str, Check] = {
    "transport": one_of("ssh", "local"),
    "hostname": TEXT,
    "user": TEXT,
    "port": _PORT,
    "jump": TEXT,
    "python": TEXT,
    "workdir": TEXT,
    "identity_file": TEXT,
    "known_hosts": TEXT,
    "accept_new_host_key": FLAG,
    "connect_timeout": _POSITIVE,
}
ROLE_KEYS: dict[str, tuple[type, dict[str, Check], tuple[str, ...]]] = {
    "trainer": (
        TrainerRole,
        {
            "checkpoints": TEXT,
            "complete_rule": one_of("auto", "marker", "stable"),
            "marker": TEXT,
            "stable_seconds": _POSITIVE,
        },
        ("checkpoints",),
    ),
    "eval": (
        EvalRole,
        {
            "drafters": TEXT,
            "target_model": TEXT,
            "ground_truth": TEXT,
            "ground_truth_kind": _GT["kind"],
            "prompts": TEXT,
            "threads": COUNT,
            "dtype": one_of(*DTYPES),
            "ground_truth_model": _GT["model"],
            "max_new_tokens": Sampling.CHECKS["max_new_tokens"],
            "ground_truth_concurrency": _GT["concurrency"],
            "ground_truth_timeout": _GT["timeout"],
            "ground_truth_deadline": _GT["deadline"],
            "ground_truth_phase_deadline": _GT["phase_deadline"],
            "samples": JobSpec.CHECKS["samples"],
            "reserve": _SIZE,
            **{name: JobSpec.CHECKS[name] for name in JobSpec.ROLE_SETTINGS},
        },
        ("drafters",),
    ),
}
DEFAULT_KEYS: dict[str, Check] = {
    "relay_from": TEXT,
    "relay_to": TEXT,
    "eval_host": TEXT,
    "keep": COUNT,
    "results_dir": TEXT,
}
HOST_REFERENCES = ("relay_from", "relay_to", "eval_host")


def locate_inventory(explicit: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Where the inventory is looked for, and why there; the file may not exist."""
    if explicit:
        return Path(explicit), "--inventory"
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    return Path(DEFAULT_FILE), "the current folder"


def find_inventory_path(explicit: str | os.PathLike | None = None) -> Path:
    """The inventory's path, or one line saying how to make or name one."""
    path, source = locate_inventory(explicit)
    if path.is_file():
        return path
    if path == Path(DEFAULT_FILE) and Path(EXAMPLE_FILE).is_file():  # in a clone
        raise InventoryError(
            f"no {DEFAULT_FILE} here: copy {EXAMPLE_FILE} to {DEFAULT_FILE} and put your "
            f"hosts in it (or pass --inventory FILE, or set ${ENV_VAR})"
        )
    raise InventoryError(
        f"no inventory at {path} (from {source}); pass --inventory FILE or set ${ENV_VAR} "
        f"(to write one: {EXAMPLE_FILE} in dflash's repository, docs/inventory.md)"
    )


def load_inventory(
    explicit: str | os.PathLike | None = None, *, accept_new_host_keys: bool = False
) -> Inventory:
    """Find, parse and validate the inventory; `accept_new_host_keys` sets every host's
    ``accept_new_host_key``."""
    path = find_inventory_path(explicit)
    inv = parse_inventory(path.read_text(), path)
    if accept_new_host_keys:
        inv.hosts = {
            name: replace(spec, accept_new_host_key=True) for name, spec in inv.hosts.items()
        }
    return inv


def parse_inventory(text: str, path: Path) -> Inventory:
    """Validate YAML text against the schema; every error names file, line and key."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InventoryError(f"{where}: not valid YAML: {problem}") from None
    return _Validator(path).inventory(root)


class _Validator:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, node: yaml.Node | None, message: str) -> InventoryError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return InventoryError(f"{self.path}{line}: {message}")

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what}: expected a mapping of keys to values")
        seen: set[str] = set()
        for key, _ in node.value:
            if key.value in seen:
                raise self.fail(key, f"{what}: key {key.value!r} appears twice")
            seen.add(key.value)
        return node.value

    def scalar(self, node: yaml.Node) -> Any:
        return yaml.safe_load(yaml.serialize(node)) if node is not None else None

    def fields(
        self,
        node: yaml.Node,
        what: str,
        schema: dict[str, Check],
        skip: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.mapping(node, what):
            name = key.value
            if name in skip:
                continue
            if name not in schema:
                allowed = ", ".join(sorted(set(schema) | set(skip)))
                raise self.fail(key, f"{what}: unknown key {name!r} (allowed: {allowed})")
            check = schema[name]
            parsed = self.scalar(value) if isinstance(value, yaml.ScalarNode) else None
            if not isinstance(value, yaml.ScalarNode) or not check(parsed):
                raise self.fail(
                    value,
                    f"{what}.{name}: expected {check.expected}, got {_describe(value, parsed)}",
                )
            out[name] = parsed
        return out

    def inventory(self, root: yaml.Node | None) -> Inventory:
        if root is None:
            raise self.fail(None, "the file is empty; it needs a 'hosts:' mapping")
        top = dict((k.value, (k, v)) for k, v in self.mapping(root, "top level"))
        for name, (key, _) in top.items():
            if name not in ("hosts", "groups", "defaults"):
                raise self.fail(
                    key, f"top level: unknown key {name!r} (allowed: defaults, groups, hosts)"
                )
        if "hosts" not in top:
            raise self.fail(root, "top level: missing required key 'hosts'")
        hosts: dict[str, HostSpec] = {}
        for key, value in self.mapping(top["hosts"][1], "hosts"):
            hosts[str(key.value)] = self.host(str(key.value), value)
        groups: dict[str, list[str]] = {}
        if "groups" in top:
            for key, value in self.mapping(top["groups"][1], "groups"):
                groups[key.value] = self.group(key.value, value, hosts)
        defaults = Defaults()
        if "defaults" in top:
            node = top["defaults"][1]
            values = self.fields(node, "defaults", DEFAULT_KEYS)
            for key, value in node.value:
                if (
                    key.value in HOST_REFERENCES
                    and value.value not in hosts
                    and value.value not in groups
                ):
                    raise self.fail(
                        value,
                        f"defaults.{key.value}: unknown host "
                        f"{value.value!r} (known: {', '.join(sorted(hosts))})",
                    )
            defaults = Defaults(**values)
        return Inventory(path=self.path, hosts=hosts, groups=groups, defaults=defaults)

    def host(self, name: str, node: yaml.Node) -> HostSpec:
        what = f"hosts.{name}"
        values = self.fields(node, what, HOST_KEYS, skip=("roles",))
        spec = HostSpec(name=name, **values)
        for key, value in self.mapping(node, what):
            if key.value == "roles":
                for role_key, role_node in self.mapping(value, f"{what}.roles"):
                    self.role(spec, role_key, role_node)
        if spec.jump and spec.transport == "local":
            raise self.fail(node, f"{what}.jump: a local host cannot have a jump host")
        return spec

    def role(self, spec: HostSpec, key: yaml.Node, node: yaml.Node) -> None:
        what = f"hosts.{spec.name}.roles.{key.value}"
        if key.value == "slurm":
            self.slurm_role(spec, what, node)
            return
        if key.value not in ROLE_KEYS:
            allowed = ", ".join([*ROLE_KEYS, "slurm"])
            raise self.fail(key, f"{what}: unknown role (allowed: {allowed})")
        cls, schema, required = ROLE_KEYS[key.value]
        values = self.fields(node, what, schema, skip=("serve",) if cls is EvalRole else ())
        for req in required:
            if req not in values:
                raise self.fail(node, f"{what}: missing required key {req!r}")
        for sub, sub_node in self.mapping(node, what):
            if sub.value == "serve":  # its own checks
                try:
                    values["serve"] = ServeSpec.from_json(self.scalars(sub_node, f"{what}.serve"))
                except ServeError as exc:
                    raise self.fail(sub_node, f"{what}.{exc}") from None
        setattr(spec, key.value, cls(**values))

    def scalars(self, node: yaml.Node, what: str) -> dict[str, Any]:
        """A mapping of single values, as parsed."""
        values: dict[str, Any] = {}
        for key, value in self.mapping(node, what):
            if not isinstance(value, yaml.ScalarNode):
                raise self.fail(value, f"{what}.{key.value}: expected a single value")
            values[str(key.value)] = self.scalar(value)
        return values

    def slurm_role(self, spec: HostSpec, what: str, node: yaml.Node) -> None:
        """The role's own checks, with the role's file and line in the message."""
        try:
            spec.slurm = SlurmRole.from_mapping(self.scalars(node, what), what)
        except SlurmError as exc:
            raise self.fail(node, str(exc)) from None

    def group(self, name: str, node: yaml.Node, hosts: dict[str, HostSpec]) -> list[str]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"groups.{name}: expected a list of host names")
        members = []
        for item in node.value:
            if item.value not in hosts:
                raise self.fail(
                    item,
                    f"groups.{name}: unknown host {item.value!r} "
                    f"(known: {', '.join(sorted(hosts))})",
                )
            members.append(item.value)
        return members


def _describe(node: yaml.Node, parsed: Any) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{type(parsed).__name__} {parsed!r}"
