"""Finding the inventory file and validating it: one line naming file, line and key."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.inventory.schema import DEFAULT_KEYS, HOST_KEYS, HOST_REFERENCES, ROLE_KEYS
from orchestrator.inventory.spec import Defaults, EvalRole, HostSpec, Inventory, InventoryError
from orchestrator.slurm.role import SlurmError, SlurmRole
from remote.online.spec import ServeError, ServeSpec
from remote.protocol import Check

ENV_VAR = "DFLASH_INVENTORY"
DEFAULT_FILE = "inventory.yaml"
EXAMPLE_FILE = "inventory.example.yaml"


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
