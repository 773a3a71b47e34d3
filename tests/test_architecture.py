"""The rooms of ARCHITECTURE.md, checked on the import graph of `orchestrator/` and `remote/`.

Every import is read with `ast`, lazy ones inside functions and those under
``TYPE_CHECKING`` included, and resolved to the module it names. The graph has no cycle,
no arrow a room's rule forbids (`FORBIDDEN`), no module of more than `MAX_LINES`
lines, and prose under `MAX_PROSE` of the product's lines. No exceptions: a module that
outgrows the limit is split where it is.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "remote")
MAX_LINES = 400
MAX_PROSE = 0.10  # docstring and comment lines, of all product lines

# (importer prefix, imported prefix, why not): a module whose name starts with the first
# never imports one whose name starts with the second. Prefixes end at a dot or the name.
FORBIDDEN = [
    ("remote", "orchestrator", "remote/ ships to hosts alone: it never imports the controller"),
    ("remote.protocol", "remote.eval", "the contract is stdlib only"),
    ("remote.protocol", "remote.jobs", "the contract is stdlib only"),
    ("remote.model", "remote.eval", "the one model reader serves the engine, not the reverse"),
    ("remote.model", "remote.probe", "the one model reader serves the probe, not the reverse"),
    ("remote.model", "remote.jobs", "the model reader knows nothing of jobs"),
    ("remote.model", "remote.relay", "the model reader knows nothing of the relay"),
    ("remote.probe", "remote.eval", "the probe reads models through remote.model"),
    ("remote.probe", "remote.jobs", "the probe knows nothing of jobs"),
    ("remote.eval", "remote.jobs", "a job kind knows nothing of the runner that runs it"),
    ("remote.online", "remote.jobs", "a job kind knows nothing of the runner that runs it"),
    ("remote.relay", "remote.eval", "the relay's host side is stdlib only"),
    ("remote.relay", "remote.jobs", "the relay's host side is stdlib only"),
    ("remote.relay", "remote.probe", "the relay's host side is stdlib only"),
    ("remote.relay", "remote.model", "the relay's host side is stdlib only"),
    ("remote.jobs", "remote.relay.scan", "a job command never loads a relay command"),
    ("remote.jobs", "remote.relay.lock", "a job command never loads a relay command"),
    ("remote.jobs", "remote.relay.send", "a job command never loads a relay command"),
    ("remote.jobs", "remote.relay.receive", "a job command never loads a relay command"),
    ("remote.jobs", "remote.relay.hashes", "a job command never loads a relay command"),
    ("remote.jobs", "remote.relay.publish", "a job command never loads a relay command"),
    ("orchestrator.errors", "orchestrator.", "the base imports no room"),
    ("orchestrator.inventory", "orchestrator.transport", "the inventory is read before hosts"),
    ("orchestrator.transport", "orchestrator.relay", "transport is below every capability"),
    ("orchestrator.transport", "orchestrator.eval", "transport is below every capability"),
    ("orchestrator.transport", "orchestrator.results", "transport is below every capability"),
    ("orchestrator.transport", "orchestrator.probe", "transport is below every capability"),
    ("orchestrator.results", "orchestrator.eval", "results are read-only over run folders"),
    ("orchestrator.results", "orchestrator.probe", "results are read-only over run folders"),
    ("orchestrator.results", "orchestrator.transport", "results never reach a host"),
    ("orchestrator.relay", "orchestrator.eval", "the relay moves files; it knows no eval"),
    ("orchestrator.relay", "orchestrator.results", "the relay moves files; it knows no run"),
    ("orchestrator.results", "orchestrator.jobs", "results are read-only over run folders"),
    ("orchestrator.eval", "orchestrator.jobs", "a job's kind knows nothing of the lifecycle"),
    ("orchestrator.eval.shards", "orchestrator.eval.follow", "shards know no follower"),
    ("orchestrator.eval.shards", "orchestrator.eval.parity", "shards know no parity"),
    ("orchestrator.eval.shards", "orchestrator.eval.online", "shards know no online run"),
    ("orchestrator.eval.follow", "orchestrator.eval.parity", "a follower evaluates, no more"),
    ("orchestrator.eval.follow", "orchestrator.eval.online", "a follower evaluates, no more"),
    ("orchestrator.eval.parity", "orchestrator.eval.shards", "parity is one pair of jobs"),
    ("orchestrator.eval.parity", "orchestrator.eval.follow", "parity is one pair of jobs"),
    ("orchestrator.eval.parity", "orchestrator.eval.online", "parity is one pair of jobs"),
    ("orchestrator.eval.online", "orchestrator.eval.shards", "an online run is one job"),
    ("orchestrator.eval.online", "orchestrator.eval.follow", "an online run is one job"),
    ("orchestrator.eval.online", "orchestrator.eval.parity", "an online run is one job"),
]
# orchestrator/eval/'s own modules are one eval, the floor its sub-rooms stand on.
EVAL_SUBROOMS = ("shards", "follow", "parity", "online")
# Imported only by these (the CLI layer above everything; the demo's catalogue of tiny
# models, with torch, only by the demo command; tests and benchmarks are outside the graph).
ONLY_FROM = {
    "orchestrator.commands": ("orchestrator.cli", "orchestrator.commands"),
    "orchestrator.cli": ("orchestrator.cli", "orchestrator.__main__"),
    "orchestrator.demo": ("orchestrator.demo", "orchestrator.commands.demo"),
}
# What the standard library and the hosts' own packages give remote/ (ARCHITECTURE.md).
REMOTE_THIRD_PARTY = {"torch", "transformers", "safetensors"}


def _under(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(prefix.rstrip(".") + ".")


def modules() -> dict[str, Path]:
    """Every module of the two packages by its dotted name (a package by its own)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every name `name` imports anywhere in its file, as the modules of `known` it
    resolves to, and any other top-level package it names (third party, stdlib)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_whole(graph):
    """The reader finds lazy imports inside functions and relative ones (or the tests
    below would pass on a graph with holes)."""
    assert "remote.eval.job" in graph["remote.jobs.run"]  # inside kind_runner
    assert "remote.eval.parity" in graph["remote.jobs.run"]
    assert "orchestrator.commands.output.relaybar" in graph["orchestrator.commands.output.live"]
    assert "torch" in graph["remote.eval.drafter"]
    assert len(graph) > 100


def test_no_module_imports_itself_round_a_circle(graph):
    found = sorted(sorted(c) for c in cycles(graph))
    assert not found, f"import cycles: {found}"


def test_no_arrow_goes_against_the_rooms(graph):
    wrong = []
    for importer, targets in graph.items():
        for target in targets:
            for src, dst, why in FORBIDDEN:
                if _under(importer, src) and _under(target, dst):
                    wrong.append(f"{importer} imports {target}: {why}")
            for guarded, allowed in ONLY_FROM.items():
                if _under(target, guarded) and not any(_under(importer, a) for a in allowed):
                    wrong.append(f"{importer} imports {target}, which only {allowed} may")
    assert not wrong, "\n".join(wrong)


def test_one_eval_imports_none_of_the_rooms_built_on_it(graph):
    """A module directly in orchestrator/eval (one eval: spec, job, wire, pull, run) never
    imports a sub-room (shards, follow, parity, online)."""
    subrooms = [f"orchestrator.eval.{room}" for room in EVAL_SUBROOMS]
    assert all(room in graph for room in subrooms)
    base = [n for n in graph if n.startswith("orchestrator.eval.") and n.count(".") == 2]
    wrong = [
        f"{name} imports {target}"
        for name in base
        if name not in subrooms
        for target in graph[name]
        if any(_under(target, room) for room in subrooms)
    ]
    assert base and not wrong, wrong


def test_remote_imports_only_the_hosts_packages(graph):
    """A host has the standard library and torch, transformers, safetensors; the contract
    (`remote.protocol` and everything it imports) has the standard library alone."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for name, targets in graph.items():
        if not _under(name, "remote"):
            continue
        outside = {t.split(".")[0] for t in targets if t not in graph} - stdlib
        assert outside <= REMOTE_THIRD_PARTY, (name, outside)
    seen, todo = set(), ["remote.protocol"]
    while todo:
        name = todo.pop()
        seen.add(name)
        outside = {t for t in graph[name] if t not in graph} - stdlib
        assert not outside, f"{name} (in the contract) imports {outside}"
        todo += [t for t in graph[name] if t in graph and t not in seen]


def test_no_module_is_longer_than_the_limit():
    long = {
        str(path.relative_to(ROOT))
        for path in modules().values()
        if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {sorted(long)}"


def _prose_lines(source: str) -> int:
    """Lines of `source` in a docstring (module, class or function) or holding a comment."""
    import io
    import tokenize

    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.update(range(first.lineno, first.end_lineno + 1))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            lines.add(tok.start[0])
    return len(lines)


def test_prose_stays_a_small_share_of_the_product():
    """Explanations live once in docs/; the code's own prose says what and why briefly."""
    sources = [path.read_text() for path in modules().values()]
    prose = sum(map(_prose_lines, sources))
    total = sum(len(s.splitlines()) for s in sources)
    assert prose / total < MAX_PROSE, f"prose {prose} of {total} lines: {prose / total:.1%}"


def test_benchmarks_import_no_test_module():
    """What the tests and the benchmarks share lives on the product side
    (`orchestrator.demo`: tiny models, loopback hosts and servers, the reference loop);
    a benchmark, or the set-up they share (`benchmarks/common/`), never imports the tests."""
    bench = ROOT / "benchmarks"
    paths = sorted(bench.rglob("*.py"))
    assert bench / "common" / "measure.py" in paths
    for path in paths:
        parts = path.relative_to(bench).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = imports(name, path, {})
        assert not any(_under(n, "tests") for n in found), (str(path), sorted(found))


def test_every_benchmark_is_in_the_suite_and_every_named_one_exists():
    """Each script in `benchmarks/` is run by `all.py` and listed in its README; every
    `benchmarks/NAME.py` the docs name is there (results.md keeps removed ones' figures)."""
    bench = ROOT / "benchmarks"
    scripts = {p.name for p in bench.glob("*.py")} - {"all.py"}
    runner = re.findall(r'"([a-z_0-9]+\.py)', (bench / "all.py").read_text())
    assert set(runner) == scripts
    readme = (bench / "README.md").read_text()
    assert [s for s in sorted(scripts) if f"`{s}`" not in readme] == []
    docs = sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").glob("*.md")) + [bench / "README.md"]
    named = {
        (p.name, m) for p in docs for m in re.findall(r"benchmarks/([\w/]+\.py)", p.read_text())
    }
    assert [(doc, m) for doc, m in sorted(named) if not (bench / m).is_file()] == []
