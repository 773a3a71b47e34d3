"""The relay's and the transport's rooms: what each module may import.

The controller and the wire contract take the relay's validators and frame reader from
`remote.relay.wire`, beside the frame format, never from a host-side command's module.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The modules of the relay's host-side commands (and the one they once shared): code that
# runs a command, not a definition the controller may import.
HOST_COMMANDS = {
    "remote.relay.host",
    "remote.relay.scan",
    "remote.relay.lock",
    "remote.relay.send",
    "remote.relay.receive",
    "remote.relay.hashes",
    "remote.relay.publish",
}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function, by absolute name (a
    ``from X import Y`` counts X, and X.Y when that is a module of the tree)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            for alias in node.names:
                sub = ROOT.joinpath(*node.module.split("."), alias.name)
                if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                    out.add(f"{node.module}.{alias.name}")
    return out


def test_the_controller_takes_the_relay_validators_from_the_wire_module():
    """No module of `orchestrator/`, nor the wire contract, imports a relay host command's
    module: `name_problem`, `path_problem` and `read_exact` live in `remote.relay.wire`."""
    importers = [
        *sorted((ROOT / "orchestrator").rglob("*.py")),
        *sorted((ROOT / "remote" / "protocol").glob("*.py")),
    ]
    assert len(importers) > 50  # the glob found the tree
    found = {_module(p): sorted(imports_of(p) & HOST_COMMANDS) for p in importers}
    assert {m: names for m, names in found.items() if names} == {}
    users = [
        m for m, p in zip(found, importers, strict=True) if "remote.relay.wire" in imports_of(p)
    ]
    assert "orchestrator.relay.checkpoints" in users and "remote.protocol" in users


# What each relay host command loads of the others' modules at its start: its own, and
# what it runs (a sender puts a scan in its ready frame; the lock holder answers a scan
# and imports the rest at their first request).
COMMAND_LOADS = {
    "relay-scan": {"remote.relay.scan"},
    "relay-lock": {"remote.relay.lock", "remote.relay.scan"},
    "relay-send": {"remote.relay.send", "remote.relay.scan"},
    "relay-recv": {"remote.relay.receive"},
    "relay-hash": {"remote.relay.hashes"},
    "relay-publish": {"remote.relay.publish"},
}


def test_each_relay_host_command_imports_only_what_it_runs():
    """A relay runs several short host-side commands, each in a fresh interpreter: each one
    starts with its own module and what it calls, no other command's, and without
    `dataclasses` or `typing` (several ms of every start)."""
    code = (
        "import json, sys; from remote.cli import build_parser; build_parser(sys.argv[1]); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    for command, expected in COMMAND_LOADS.items():
        proc = subprocess.run(
            [sys.executable, "-S", "-c", code, command],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        loaded = set(json.loads(proc.stdout))
        assert loaded & HOST_COMMANDS == expected, command
        assert not loaded & {"dataclasses", "typing", "remote.protocol"}, command


def _definitions(name: str) -> list[str]:
    """The modules of `orchestrator/` and `remote/` that define `name` at their top."""
    found = []
    for path in sorted([*(ROOT / "orchestrator").rglob("*.py"), *(ROOT / "remote").rglob("*.py")]):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
                found.append(_module(path))
    return found


def test_one_line_reader_serves_the_relay_and_the_transport():
    """The relay lock holder's answers and a job's are read by the one bounded line reader
    of the transport, which the relay's lock holder uses too."""
    assert _definitions("LineReader") == ["orchestrator.transport.lines"]
    holder = imports_of(ROOT / "orchestrator" / "relay" / "holder.py")
    assert "orchestrator.transport.lines" in holder


def test_both_ends_of_a_relay_stream_widen_their_pipes_with_one_function():
    """The hosts' commands and the controller's pump grow their pipes to 1 MiB through the
    one `widen_pipe`, beside the hosts' other pipe helpers."""
    assert _definitions("widen_pipe") + _definitions("_widen_pipe") == ["remote.relay.pipes"]
    assert "remote.relay.pipes" in imports_of(ROOT / "orchestrator" / "relay" / "stream.py")


ROOMS = ("orchestrator/relay", "orchestrator/transport", "remote/relay")


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports (anywhere in it, lazily too)."""
    paths = [*(ROOT / "orchestrator").rglob("*.py"), *(ROOT / "remote").rglob("*.py")]
    modules = {_module(p): p for p in paths}
    return {m: imports_of(p) & modules.keys() - {m} for m, p in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The sets of modules that import each other round a circle (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = set()
            while True:
                n = stack.pop()
                component.add(n)
                if n == m:
                    break
            if len(component) > 1:
                out.append(component)

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def test_no_import_circles_through_the_relay_or_the_transport():
    """No module of the relay's or the transport's rooms imports, even lazily or for types,
    a module that imports it back (`transport.hosts` and `ssh_settings` once did, for
    `last_line`; `relay.openssh_host` and `relay.stream` for the ssh options)."""
    graph = _graph()
    mine = {m for m in graph if any(m.startswith(r.replace("/", ".") + ".") for r in ROOMS)}
    assert len(mine) > 30  # the rooms were found
    assert [c for c in _circles(graph) if c & mine] == []


def test_no_module_of_the_relay_or_the_transport_is_over_500_lines():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for room in ROOMS
        for p in (ROOT / room).glob("*.py")
    }
    assert len(sizes) > 30
    assert {p: n for p, n in sizes.items() if n > 500} == {}
