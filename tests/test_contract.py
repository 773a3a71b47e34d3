"""The contract is written once (`remote.protocol`): no product module restates a value test,
a vocabulary or a default that lives there, and each typed block of the job document is
checked by the same function on the controller and on the host."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from remote.protocol import COUNT, Check, is_int, one_of

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("orchestrator", "remote", "benchmarks")
CONTRACT = ROOT / "remote" / "protocol"


def _modules(outside_contract: bool = True) -> list[Path]:
    out = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if outside_contract and CONTRACT in path.parents:
                continue
            out.append(path)
    return out


def _is_bool_exclusion(node: ast.AST) -> bool:
    """``isinstance(x, bool)`` (under a ``not`` or not): half of a hand-written int test."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and len(node.args) == 2
        and isinstance(node.args[1], ast.Name)
        and node.args[1].id == "bool"
    )


def test_a_whole_number_is_tested_in_one_place():
    """`is_int` (and `is_number`) are the contract's; no product module spells the test
    again (``isinstance(v, int) and not isinstance(v, bool)``) or defines its own."""
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in ("_is_int", "_is_num"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} def {node.name}")
            if isinstance(node, ast.BoolOp) and any(
                _is_bool_exclusion(v.operand if isinstance(v, ast.UnaryOp) else v)
                for v in node.values
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], found
    assert is_int(3) and not is_int(True) and not is_int(3.0)


def test_a_check_names_the_setting_as_each_side_does():
    assert COUNT.message("--gt-concurrency", 0) == (
        "--gt-concurrency must be a whole number of at least 1, got 0"
    )
    kinds = one_of("a", "b")
    assert kinds("a") and not kinds("c") and not kinds(["a"])
    assert kinds.message("--kind", "c") == "unknown --kind 'c' (one of a, b)"
    assert isinstance(kinds, Check) and kinds.expected == "one of a, b"


def test_value_types_are_worded_once_for_documents_result_files_and_answers():
    """One vocabulary of value types (`remote.protocol.values`): the words of each `Check`
    there are written nowhere else in the product, and a true/false field reads the same in
    a job document, a result file and a job answer."""
    from remote.protocol import (
        FLAG,
        AnswerError,
        JobSpec,
        ResultError,
        SpecError,
        check_job_answer,
        check_spec,
        values,
    )

    words = {v.expected for v in vars(values).values() if isinstance(v, Check)}
    words = {w for w in words if " " in w}  # "text" is also an everyday constant
    again = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for path in _modules(outside_contract=False)
        if path != CONTRACT / "values.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in words
    ]
    assert again == [], again
    with pytest.raises(SpecError) as doc:
        JobSpec.from_json({"thinking": "yes"})
    with pytest.raises(ResultError) as result:
        check_spec({"thinking": "yes"})
    status = {"job_id": "j1", "state": "done", "dir": "/w/jobs/j1", "has_result": "yes"}
    with pytest.raises(AnswerError) as answer:
        check_job_answer("status", status)
    for line in (doc.value, result.value, answer.value):
        assert str(line).endswith(f"{FLAG.expected}, got 'yes'") or (
            f"expected {FLAG.expected}" in str(line)
        ), line


def test_a_dtypes_size_comes_from_the_one_dtype_table():
    """The byte size preflight counts a weight at, for every dtype of the eval vocabulary,
    is the one `ST_DTYPES` gives (and torch agrees)."""
    import torch

    from remote.eval import preflight
    from remote.model.files import dtype_bytes
    from remote.protocol import DTYPES

    for name in DTYPES:
        assert dtype_bytes(name) == torch.empty(0, dtype=getattr(torch, name)).element_size()
    assert not hasattr(preflight, "DTYPE_BYTES")


def _constants(tree: ast.AST):
    """String constants that are values (not docstrings)."""
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node


def test_job_kinds_and_states_are_named_once():
    """The job kinds are `JobKind`'s and the states `JobState`'s: no product module outside
    the contract spells a parity kind, or lists job states (a tuple, set or table keyed by
    them, of job states only: Slurm's verdicts and progress counters are other words)."""
    from remote.protocol import JOB_KINDS, JOB_STATES

    states = set(JOB_STATES)
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        where = path.relative_to(ROOT)
        for node in _constants(tree):
            if node.value in JOB_KINDS[1:]:
                found.append(f"{where}:{node.lineno} {node.value!r}")
        for node in ast.walk(tree):
            items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
            items = node.keys if isinstance(node, ast.Dict) else items
            named = {i.value if isinstance(i, ast.Constant) else None for i in items}
            if len(named) >= 2 and named <= states:  # a list of job states, nothing else
                found.append(f"{where}:{node.lineno} {sorted(named)}")
    assert found == [], found


def test_attention_implementations_and_the_parity_inbox_are_the_contracts():
    """The attention implementations are listed once (`ATTN_IMPLEMENTATIONS`), both sides
    refuse another with the same check, and parity's inbox on B is a relay partial folder
    by the relay's own prefix, not a copy of it."""
    from orchestrator.eval.parity import run as parity
    from remote.protocol import ATTN, ATTN_IMPLEMENTATIONS, PARTIAL_PREFIX

    found = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                named = {i.value for i in node.elts if isinstance(i, ast.Constant)}
                if named >= set(ATTN_IMPLEMENTATIONS):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        for node in ast.walk(tree):  # a name in a relay folder, written out (not a temp)
            value = node.value if isinstance(node, ast.Assign) else None
            if (
                isinstance(value, ast.Constant)
                and str(value.value).startswith(PARTIAL_PREFIX)
                and path.name != "wire.py"  # where PARTIAL_PREFIX itself is defined
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {value.value!r}")
    assert found == [], found
    assert parity.INBOX.startswith(PARTIAL_PREFIX)
    assert ATTN("sdpa") and not ATTN("flash")
    with __import__("pytest").raises(Exception, match=r"unknown --attn-a 'flash' \(one of sdpa"):
        parity.ParityOptions(attn_a="flash")


def test_the_ground_truth_kinds_and_their_default_are_written_once():
    """`GT_KINDS`, `SERVER_KINDS` and `DEFAULT_SERVER_KIND` are the contract's: no product
    module lists server kinds or writes the default kind as a fallback of its own."""
    from remote.protocol import DEFAULT_SERVER_KIND, GT_KINDS, SERVER_KINDS

    assert DEFAULT_SERVER_KIND in SERVER_KINDS and set(SERVER_KINDS) < set(GT_KINDS)
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                named = {i.value for i in node.elts if isinstance(i, ast.Constant)}
                if len(named & set(GT_KINDS)) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            # ``.get("kind", "sglang")``, ``x or "sglang"``, ``kind: str = "sglang"``
            fallback = (
                node.args[1]
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and len(node.args) == 2
                else node.values[-1]
                if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)
                else node.value
                if isinstance(node, ast.AnnAssign)
                else None
            )
            if isinstance(fallback, ast.Constant) and fallback.value == DEFAULT_SERVER_KIND:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {DEFAULT_SERVER_KIND!r}")
    assert found == [], found


# The same bad value of a job setting, as the command line (an EvalOptions field), the
# inventory (a key of roles.eval) and a job document sent to a host carry it.
BAD_SETTINGS = {
    "concurrency": ("ground_truth_concurrency", 0, {"ground_truth": {"concurrency": 0}}),
    "kind": ("ground_truth_kind", "vllm", {"ground_truth": {"kind": "vllm"}}),
    "samples": ("samples", 0, {"samples": 0}),
    "max_new_tokens": ("max_new_tokens", -3, {"sampling": {"max_new_tokens": -3}}),
}


def _inventory_line(key: str, value: object) -> str:
    from orchestrator.inventory import InventoryError, parse_inventory

    text = f"hosts:\n  h:\n    roles:\n      eval: {{drafters: /d, {key}: {value}}}\n"
    try:
        parse_inventory(text, Path("inv.yaml"))
    except InventoryError as exc:
        return str(exc)
    raise AssertionError(f"the inventory took {key}: {value}")


@pytest.mark.parametrize("name", list(BAD_SETTINGS))
def test_a_bad_job_setting_is_refused_by_one_check_on_every_side(name):
    """A ground-truth concurrency, kind, sample count or completion length no job can run
    with is refused by the command line, the inventory and the host reading a job document,
    each naming the setting its own way, by the one `Check` the contract defines for it:
    the same object on every side, so the same words."""
    from orchestrator.errors import DflashError
    from orchestrator.eval.spec import OPTION_CHECKS, EvalOptions
    from orchestrator.inventory import ROLE_KEYS
    from remote.protocol import GroundTruthSpec, JobSpec, Sampling, SpecError

    field, value, doc = BAD_SETTINGS[name]
    contract = {
        "concurrency": GroundTruthSpec.CHECKS["concurrency"],
        "kind": GroundTruthSpec.CHECKS["kind"],
        "samples": JobSpec.CHECKS["samples"],
        "max_new_tokens": Sampling.CHECKS["max_new_tokens"],
    }[name]
    assert OPTION_CHECKS[field][1] is contract
    assert ROLE_KEYS["eval"][1][field] is contract
    with pytest.raises(DflashError) as cli:
        EvalOptions(**{field: value})
    with pytest.raises(SpecError) as host:
        JobSpec.from_json(doc)
    lines = {
        "cli": str(cli.value),
        "inventory": _inventory_line(field, value),
        "host": str(host.value),
    }
    for side, line in lines.items():
        assert contract.expected in line and str(value) in line, (side, line)
        assert "\n" not in line, (side, line)


def test_the_default_kind_and_a_missing_url_read_the_same_on_both_sides():
    """No kind given: both sides take the contract's default, a URL alone is asked as the
    default server kind and nothing at all is made by the target on the host; a server kind
    without a URL is refused by the same words on the controller and the host, naming the
    target's own ground truth as the other way."""
    from remote.protocol import DEFAULT_SERVER_KIND, SERVER_KINDS, GroundTruthSpec, JobSpec

    job = JobSpec.from_json({"ground_truth": {}})
    assert job.ground_truth.kind == GroundTruthSpec().kind == "local"
    assert job.ground_truth.source.on_target and job.ground_truth.missing_source() is None
    assert DEFAULT_SERVER_KIND in SERVER_KINDS
    url = JobSpec.from_json({"ground_truth": {"url": "http://127.0.0.1:1"}}).ground_truth
    assert url.kind == DEFAULT_SERVER_KIND == GroundTruthSpec(url="http://127.0.0.1:1").kind
    asked = JobSpec.from_json({"ground_truth": {"kind": "openai"}}).ground_truth
    assert "needs a server URL" in asked.missing_source()
    assert "ground_truth_kind local" in asked.missing_source()
    back = GroundTruthSpec.from_json(GroundTruthSpec(url="http://127.0.0.1:1").to_json())
    assert back == GroundTruthSpec(url="http://127.0.0.1:1") and back.missing_source() is None


def test_every_ground_truth_kind_is_one_entry_with_a_host_source_and_no_chains():
    """Each kind of the contract (`GT_SOURCES`) has exactly one source on the host that
    makes it; no product module compares a kind with a name (``if kind == "file"``), and
    the ground truth's own modules write no kind's name: what differs between kinds is an
    entry's attribute or its source's method."""
    from remote.eval.groundtruth.phase import SOURCES
    from remote.protocol import GT_SOURCES

    assert set(SOURCES) == set(GT_SOURCES)
    assert all(SOURCES[name].kind is kind for name, kind in GT_SOURCES.items())
    own = [ROOT / "remote/eval/groundtruth", ROOT / "orchestrator/eval/shards"]
    own += [ROOT / f for f in ("remote/eval/preflight.py", "orchestrator/eval/spec.py")]
    found = []
    for path in _modules(outside_contract=False):
        if "relay" in path.parts:  # a checkpoint's kind there: a folder or a single file
            continue
        ground_truths = path in own or any(d in path.parents for d in own)
        for node in ast.walk(ast.parse(path.read_text())):
            sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            names = [c for c in sides if isinstance(c, ast.Constant) and c.value in GT_SOURCES]
            if names and any("kind" in ast.unparse(c) for c in sides if c not in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
            if ground_truths and isinstance(node, ast.Constant) and node.value in GT_SOURCES:
                if node.value != "file":  # also the name of a file, in a ground truth's info
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == [], found


def test_the_prompts_sha256_a_job_carries_is_checked_where_the_job_is_read():
    from remote.protocol import JobSpec, SpecError

    sha = "ab" * 32
    doc = {"prompts": {"path": "/w/prompts/x.jsonl", "sha256": sha}}
    assert JobSpec.from_json(doc).prompts_sha256 == sha
    assert JobSpec.from_json({"prompts": {"path": "/p.jsonl"}}).prompts_sha256 is None
    with pytest.raises(SpecError, match=r"the prompts' sha256 .*64 lowercase hex digits"):
        JobSpec.from_json({"prompts": {"path": "/p.jsonl", "sha256": "AB" * 32}})
