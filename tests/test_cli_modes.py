"""The CLI's modes as its users expect them: a job's lifecycle is `dflash jobs list |
attach | cancel` (one library call each, `orchestrator.jobs`; `dflash jobs` alone lists),
and what a command line asks for is resolved by a library request builder
(`eval_request`, `parity_request`, `follow_request`), so no command checks combinations of
options itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from orchestrator.cli import with_default_subcommand
from orchestrator.errors import DflashError
from orchestrator.eval.follow.options import follow_request
from orchestrator.eval.parity.options import ParityOptions, parity_request
from orchestrator.eval.request import eval_request
from orchestrator.eval.spec import EvalOptions
from orchestrator.inventory import parse_inventory
from tests.helpers.cli import dflash, one_error_line

COMMANDS = Path(__file__).resolve().parent.parent / "orchestrator" / "commands"

INVENTORY = """
hosts:
  trainer:
    transport: local
    roles: {trainer: {checkpoints: /tmp/ckpts}}
  eval-a:
    transport: local
    roles: {eval: {drafters: /tmp/drafters}}
  eval-b:
    transport: local
    roles: {eval: {drafters: /tmp/drafters-b}}
groups:
  evals: [eval-a, eval-b]
defaults:
  relay_from: trainer
  relay_to: eval-a
  eval_host: eval-a
  keep: 3
"""


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return parse_inventory(INVENTORY, path)


def test_jobs_alone_lists_and_other_words_stay_as_they_are():
    assert with_default_subcommand(["jobs"]) == ["jobs", "list"]
    assert with_default_subcommand(["jobs", "-H", "a", "--json"]) == [
        "jobs",
        "list",
        "-H",
        "a",
        "--json",
    ]
    for same in (["jobs", "--help"], ["jobs", "cancel", "J"], ["remote-eval", "--detach"]):
        assert with_default_subcommand(same) == same


def test_a_job_s_lifecycle_is_the_jobs_command(tmp_path, make_inventory):
    """`jobs attach` and `jobs cancel` are the only forms: nothing was released with the
    old `remote-eval --attach/--cancel`, which are unknown options like any other."""
    wd = tmp_path / "wd"
    inv = make_inventory(
        hosts={
            "ev": {
                "transport": "local",
                "workdir": str(wd),
                "roles": {"eval": {"drafters": str(tmp_path / "d")}},
            }
        },
        defaults={"eval_host": "ev"},
    )
    for args in (("jobs", "cancel", "nope"), ("jobs", "attach", "nope", "--host", "ev")):
        proc = dflash(*args, "-i", str(inv))
        assert proc.returncode != 0
        assert "no job 'nope'" in one_error_line(proc)
    for old in (("remote-eval", "--cancel", "J"), ("parity", "--attach", "J")):
        proc = dflash(*old, "-i", str(inv))
        assert proc.returncode == 2
        line = one_error_line(proc)
        assert f"No such option: {old[1]}" in line and "deprecated" not in line, line
    listed = dflash("jobs", "-i", str(inv), "--json")  # `jobs` alone: the list
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert json.loads(listed.stdout) == []


def test_eval_request_picks_the_host_or_the_shards(inv):
    options = EvalOptions(samples=2)
    req = eval_request(inv, "step_1", options)
    assert (req.host, req.hosts, req.detach, req.options) == ("eval-a", [], False, options)
    req = eval_request(inv, "step_1", host="eval-b", detach=True)
    assert (req.host, req.hosts, req.detach) == ("eval-b", [], True)
    req = eval_request(inv, "step_1", hosts="evals, eval-b")
    assert (req.host, req.hosts) == (None, ["evals", "eval-b"])
    for kw in ({"host": "eval-b"}, {"detach": True}):
        with pytest.raises(DflashError, match="--hosts runs a sharded eval to the end"):
            eval_request(inv, "step_1", hosts="evals", **kw)
    with pytest.raises(DflashError, match="is a group of 2 hosts"):
        eval_request(inv, "step_1", host="evals")


def test_parity_request_takes_two_hosts(inv):
    opts = ParityOptions()
    req = parity_request(inv, "trainer, eval-a", opts)
    assert (req.host_a, req.host_b, req.options) == ("trainer", "eval-a", opts)
    for hosts in (None, "eval-a", "trainer,eval-a,eval-b"):
        with pytest.raises(DflashError, match="--hosts needs exactly two hosts"):
            parity_request(inv, hosts, opts)


def test_follow_request_takes_the_inventory_defaults(inv, tmp_path):
    req = follow_request(inv)
    assert (req.source, req.dest, req.options.keep) == ("trainer", "eval-a", 3)
    req = follow_request(inv, "eval-b", "trainer", keep=1, interval=5, probe=True)
    assert (req.source, req.dest) == ("eval-b", "trainer")
    assert (req.options.keep, req.options.interval, req.options.probe) == (1, 5, True)
    bare = parse_inventory("hosts:\n  a: {transport: local}\n", tmp_path / "i.yaml")
    with pytest.raises(DflashError, match="follow needs --from TRAINER and --to EVAL_HOST"):
        follow_request(bare, "a")


def test_commands_refuse_nothing_themselves():
    """What is wrong with a command line is said by the library (a request builder, an
    options class) or by the parser: no command module raises, so none checks which
    options go together by hand. (`common` holds the options' parse callbacks.)"""
    modules = [p for p in COMMANDS.glob("*.py") if p.name not in ("__init__.py", "common.py")]
    assert {"remote_eval", "parity", "follow", "jobs"} <= {p.stem for p in modules}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            assert not isinstance(node, ast.Raise), f"{path.name}:{node.lineno} raises"
