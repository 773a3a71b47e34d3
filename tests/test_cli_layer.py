"""The CLI layer stays thin: commands parse, make one library call and render through
`orchestrator.commands.output`; what they decided before lives in library functions, tested
here directly (`relay_request`, `Inventory.listing`, `output.emit`)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from orchestrator.commands import output
from orchestrator.errors import DflashError
from orchestrator.inventory import parse_inventory
from orchestrator.relay.request import relay_request

COMMANDS = Path(__file__).resolve().parent.parent / "orchestrator" / "commands"

INVENTORY = """
hosts:
  trainer:
    transport: local
    roles: {trainer: {checkpoints: /tmp/ckpts}}
  eval-a:
    transport: ssh
    hostname: 10.0.0.2
    user: me
    port: 2222
    jump: trainer
    roles: {eval: {drafters: /tmp/drafters}}
  eval-b:
    transport: local
    roles: {eval: {drafters: /tmp/drafters-b}}
groups:
  evals: [eval-a, eval-b]
defaults:
  relay_from: trainer
  relay_to: evals
  keep: 3
"""


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return parse_inventory(INVENTORY, path)


def _command_modules() -> list[Path]:
    return sorted(p for p in COMMANDS.glob("*.py") if p.name not in ("__init__.py",))


def test_commands_do_not_import_each_other_or_branch_on_json():
    """No command module imports another one (only `common` and `output` are shared), what
    they take from `output` exists, and none decides between JSON and tables itself:
    ``json_out`` only travels to `output`."""
    names = {p.stem for p in _command_modules()} - {"common"}
    assert {"relay", "results", "remote_eval", "hosts"} <= names  # the glob found them
    for path in _command_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[:2] == ["orchestrator", "commands"] and len(parts) > 2:
                    assert parts[2] in ("common", "output"), f"{path.name} imports {node.module}"
                if node.module == "orchestrator.commands":
                    assert {a.name for a in node.names} <= {"output", "common"}, path.name
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "output"
            ):  # every renderer a command names is there
                assert hasattr(output, node.attr), f"{path.name}:{node.lineno} output.{node.attr}"
            if isinstance(node, (ast.If, ast.IfExp)):
                names_in_test = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                assert "json_out" not in names_in_test, f"{path.name}:{node.lineno}"


def test_emit_prints_json_or_the_human_view_never_both(capsys):
    shown = []
    output.emit({"a": 1}, True, human=shown.append)
    assert json.loads(capsys.readouterr().out) == {"a": 1} and shown == []
    output.emit({"a": 1}, True, human=shown.append, as_json=lambda r: [r["a"]])
    assert json.loads(capsys.readouterr().out) == [1]
    output.emit({"a": 1}, False, human=shown.append, as_json=lambda r: 1 / 0)
    assert shown == [{"a": 1}] and capsys.readouterr().out == ""


def test_relay_request_takes_the_inventory_defaults(inv):
    req = relay_request(inv)
    assert req.source == "trainer"
    assert req.dests == ["evals"]  # a group: the relay expands it
    assert req.options.keep == 3 and req.options.reserve is None and req.options.names == []
    req = relay_request(inv, "eval-b", ["eval-a,trainer", "eval-b"], ["s1"], keep=1, reserve="2K")
    assert (req.source, req.dests) == ("eval-b", ["eval-a", "trainer", "eval-b"])
    assert (req.options.keep, req.options.reserve, req.options.names) == (1, 2048, ["s1"])


def test_relay_request_refuses_two_selections_and_no_source(inv, tmp_path):
    with pytest.raises(DflashError, match="choose one of CHECKPOINT names"):
        relay_request(inv, names=["s1"], step=4)
    with pytest.raises(DflashError, match="choose one of"):
        relay_request(inv, latest=True, all_=True)
    bare = parse_inventory("hosts:\n  a: {transport: local}\n", tmp_path / "i.yaml")
    with pytest.raises(DflashError, match="no source: pass --from HOST"):
        relay_request(bare)


def test_inventory_listing_addresses_and_roles(inv):
    listing = inv.listing()
    rows = {r["name"]: r for r in listing["hosts"]}
    assert rows["trainer"]["address"] == "local" and rows["trainer"]["roles"] == ["trainer"]
    assert rows["eval-a"]["address"] == "me@10.0.0.2:2222"
    assert rows["eval-a"]["jump"] == "trainer" and rows["eval-a"]["roles"] == ["eval"]
    assert listing["groups"] == {"evals": ["eval-a", "eval-b"]}
    assert listing["inventory"].endswith("inventory.yaml")
