"""Bad inputs on the eval side, the CLI and the inventory, table-driven (the relay's own
cases are in ``test_bad_inputs_relay.py``). Every case asserts the exit code, ONE line naming
the problem (no traceback), and that nothing was connected to, written or cached:

- CLI: each command's count options, run as a user would (a child ``python -m
  orchestrator``), against an inventory whose hosts are a TCP tripwire: a bad value must be
  refused before any connection is even opened;
- inventory: zero or negative counts refused at load, naming the file, line and key;
- host side: the preflight refuses counts the job would only trip over later;
- ground truth: a real HTTP server answering bad ids or a sampled answer makes the host's
  job runner (``remote.jobs.run.run``, what ``python -m remote job run`` runs for
  ``remote-eval``) fail in one line, with no cache entry written.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from remote.errors import ERROR_PREFIX, EXIT_USER_ERROR
from tests.helpers.cli import ROOT, dflash, one_error_line
from tests.helpers.servers import ScriptedServer, ids_reply


class Tripwire:
    """A TCP listener that counts the connections made to it (and closes each at once)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()


@pytest.fixture(scope="module")
def tripwire():
    wire = Tripwire()
    yield wire
    wire.sock.close()


def _host(port: int, roles: dict) -> dict:
    return {
        "hostname": "127.0.0.1",
        "port": port,
        "user": "nobody",
        "connect_timeout": 2,
        "workdir": "/tmp/dflash-never-used",
        "roles": roles,
    }


def _inventory_doc(tmp_path: Path, port: int) -> dict:
    return {
        "hosts": {
            "trainer": _host(port, {"trainer": {"checkpoints": "/srv/ckpt"}}),
            "evalhost": _host(
                port,
                {
                    "eval": {
                        "drafters": "/srv/drafters",
                        "target_model": "/srv/target",
                        "ground_truth": "http://127.0.0.1:9",
                    }
                },
            ),
        },
        "defaults": {
            "relay_from": "trainer",
            "relay_to": "evalhost",
            "eval_host": "evalhost",
            "results_dir": str(tmp_path / "results"),
        },
    }


@pytest.fixture
def inventory(tmp_path, tripwire) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(_inventory_doc(tmp_path, tripwire.port), sort_keys=False))
    return path


EVAL = ("remote-eval", "--checkpoint", "step_1")
FOLLOW = ("follow", "--once")

# (id, arguments, what the one line must say). Exit code 2 for all: a usage error.
CLI_CASES = [
    ("eval-samples-0", (*EVAL, "--samples", "0"), r"'--samples'.*1"),
    ("eval-samples-negative", (*EVAL, "--samples", "-3"), r"'--samples'.*1"),
    ("eval-samples-not-a-number", (*EVAL, "--samples", "many"), r"'--samples'"),
    ("eval-max-new-tokens-0", (*EVAL, "--max-new-tokens", "0"), r"'--max-new-tokens'.*1"),
    ("eval-threads-negative", (*EVAL, "--threads", "-2"), r"'--threads'.*1"),
    ("eval-threads-0", (*EVAL, "--threads", "0"), r"'--threads'.*1"),
    ("eval-topk-0", (*EVAL, "--topk", "0"), r"'--topk'.*1"),
    (
        "eval-budgets-0",
        (*EVAL, "--budgets", "0,8"),
        r"--budgets must be whole numbers of at "
        r"least 1, got 0,8",
    ),
    ("eval-budgets-negative", (*EVAL, "--budgets", "8,-4"), r"--budgets .* got 8,-4"),
    ("eval-budgets-text", (*EVAL, "--budgets", "8,x"), r"--budgets expects comma-separated"),
    ("eval-temperature", (*EVAL, "--temperature", "-1"), r"temperature must be a number from 0"),
    ("eval-top-p-greedy", (*EVAL, "--top-p", "0.9"), r"--top-p apply to sampled ground truth"),
    (
        "eval-draft-policy-greedy",
        (*EVAL, "--draft-policy", "sample"),
        r"--draft-policy applies above temperature 0 only",
    ),
    (
        "eval-draft-policy",
        (*EVAL, "--temperature", "1", "--draft-policy", "best"),
        r"unknown draft-policy 'best' \(one of argmax, sample\)",
    ),
    (
        "eval-gt-kind",
        (*EVAL, "--ground-truth-kind", "vllm"),
        r"unknown --ground-truth-kind 'vllm' \(one of sglang, openai",
    ),
    ("eval-positions", (*EVAL, "--positions", "some"), r"--positions must be 'all' or 'walk'"),
    (
        "eval-prompts-missing",
        (*EVAL, "--prompts", "/nonexistent/p.jsonl"),
        r"prompts '/nonexistent/p.jsonl' is neither a built-in set",
    ),
    (
        "eval-sharded-samples-0",
        ("remote-eval", "--checkpoint", "step_1", "--hosts", "evalhost", "--samples", "0"),
        r"'--samples'.*1",
    ),
    ("follow-samples-0", (*FOLLOW, "--samples", "0"), r"'--samples'.*1"),
    ("follow-max-new-tokens-0", (*FOLLOW, "--max-new-tokens", "0"), r"'--max-new-tokens'"),
    ("follow-interval-0", (*FOLLOW, "--interval", "0"), r"'--interval': must be more than 0"),
    ("follow-interval-negative", (*FOLLOW, "--interval", "-5"), r"'--interval'.*-5"),
    ("follow-keep-0", (*FOLLOW, "--keep", "0"), r"'--keep'.*1"),
    ("follow-budgets-0", (*FOLLOW, "--budgets", "0"), r"--budgets must be whole numbers"),
    ("relay-keep-0", ("relay", "--keep", "0"), r"'--keep'.*1"),
    ("relay-jobs-0", ("relay", "--jobs", "0"), r"'--jobs'.*1"),
    ("relay-step-negative", ("relay", "--step", "-1"), r"'--step'.*0"),
    ("relay-reserve-negative", ("relay", "--reserve", "-5G"), r"not a size: '-5G'"),
    ("option-with-brackets", (*EVAL, "--[bold]x"), r"No such option: --\[bold\]x"),
    (
        "probe-depth-negative",
        ("probe-structure", "--host", "evalhost", "--depth", "-1"),
        r"'--depth'.*0",
    ),
    ("unknown-option", (*EVAL, "--sample", "3"), r"No such option: --sample"),
]


@pytest.mark.parametrize("args,pattern", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_bad_values_before_any_connection(args, pattern, inventory, tripwire, tmp_path):
    before = tripwire.count
    proc = dflash(*args, "--inventory", str(inventory))
    assert proc.returncode == 2, proc.stderr
    assert re.search(pattern, one_error_line(proc)), proc.stderr
    assert proc.stdout == ""
    assert tripwire.count == before, "connected to a host before refusing the value"
    assert not (tmp_path / "results").exists()  # no results or follow folder begun


# (id, where in the inventory, key, bad value). Each is refused at load, exit 2.
INVENTORY_CASES = [
    ("samples-0", "eval", "samples", 0),
    ("threads-negative", "eval", "threads", -2),
    ("max-new-tokens-0", "eval", "max_new_tokens", 0),
    ("keep-0", "defaults", "keep", 0),
    ("keep-negative", "defaults", "keep", -1),
    ("gt-kind-unknown", "eval", "ground_truth_kind", "vllm"),
]


@pytest.mark.parametrize(
    "where,key,value", [c[1:] for c in INVENTORY_CASES], ids=[c[0] for c in INVENTORY_CASES]
)
def test_inventory_refuses_bad_counts_at_load(where, key, value, tmp_path, tripwire):
    doc = _inventory_doc(tmp_path, tripwire.port)
    if where == "defaults":
        doc["defaults"][key] = value
    else:
        doc["hosts"]["evalhost"]["roles"]["eval"][key] = value
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    text = path.read_text()
    before = tripwire.count
    proc = dflash(*EVAL, "--inventory", str(path))
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert "inventory.yaml:" in line and key in line, line
    if isinstance(value, int):
        assert "at least 1" in line, line
    assert tripwire.count == before and path.read_text() == text
    assert not (tmp_path / "results").exists()


def _remote(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """The host-side program from this source tree, as the bundle runs it on a host."""
    return subprocess.run(
        [sys.executable, "-m", "remote", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize(
    "key,value",
    [("threads", -2), ("samples", 0), ("threads", "4")],
    ids=["threads-negative", "samples-0", "threads-text"],
)
def test_host_preflight_refuses_bad_counts(key, value):
    """A job spec built by another controller (or by hand) is checked on the host too: the
    count is refused by preflight, not after the ground-truth phase."""
    spec = {"eval": {"dtype": "float32", "target": "/nonexistent"}}
    # threads is an engine setting (the job's EvalSpec); samples a job's own
    (spec["eval"] if key == "threads" else spec)[key] = value
    proc = _remote("preflight", "--spec", "-", stdin=json.dumps(spec))
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        lines[0]
        == f"{ERROR_PREFIX}job spec: {key} must be a whole number of at least 1, got {value!r}"
    )
    assert proc.stdout == ""


def _sglang(answer: dict):
    return lambda path, body: answer


def _openai_choice(**choice):
    return lambda path, body: {
        "choices": [{"index": 0, "text": "", "prompt_token_ids": body.get("prompt"), **choice}]
    }


def _run_job(job: Path) -> int:
    """The host's job runner, as ``python -m remote job run --dir JOB`` calls it (in this
    process: the runner's import of transformers costs seconds per child on a busy box).
    It installs SIGTERM/SIGHUP handlers for a detached job; the test's own are restored."""
    import signal

    from remote.jobs.run import run

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return run(job)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


BIG = 10**6
# (id, kind, the server's reply, what the job's one error line must say).
GT_CASES = [
    (
        "sglang-id-outside-vocab",
        "sglang",
        ids_reply([5, BIG]),
        rf"holds token id {BIG}, outside the target's vocabulary \(0\.\.\d+\)",
    ),
    ("sglang-negative-id", "sglang", ids_reply([5, -1]), r"holds token id -1, outside"),
    ("openai-id-outside-vocab", "openai", ids_reply([BIG]), rf"token id {BIG}, outside"),
    ("sglang-float-ids", "sglang", ids_reply([5.0, 6.5]), r"not a list of integer token ids"),
    ("sglang-bool-ids", "sglang", ids_reply([True, False]), r"not a list of integer token"),
    ("sglang-empty", "sglang", ids_reply([]), r"is empty \(the target stopped at once\)"),
    (
        "sglang-too-many-ids",
        "sglang",
        ids_reply(list(range(5, 14))),
        r"has 9 token ids, more than max_new_tokens 4",
    ),
    (
        "sglang-no-output-ids",
        "sglang",
        _sglang({"text": "hello"}),
        r"answered without an 'output_ids' list",
    ),
    (
        "sglang-sampled",
        "sglang",
        _sglang(
            {
                "output_ids": [5, 6],
                "meta_info": {"sampling_params": {"temperature": 0.7, "top_p": 0.9}},
            }
        ),
        r"reports other sampling than asked: temperature=0.7 \(asked 0.0\), top_p=0.9",
    ),
    (
        "openai-sampled",
        "openai",
        _openai_choice(token_ids=[5, 6], temperature=1.0),
        r"reports other sampling than asked: temperature=1.0 \(asked 0.0\)",
    ),
    (
        "openai-do-sample",
        "openai",
        _openai_choice(token_ids=[5], sampling_params={"do_sample": True, "temperature": 0.6}),
        r"other sampling than asked: temperature=0.6 \(asked 0.0\), do_sample=True",
    ),
]


@pytest.mark.parametrize(
    "kind,reply,pattern", [c[1:] for c in GT_CASES], ids=[c[0] for c in GT_CASES]
)
def test_bad_ground_truth_answer_fails_the_job_in_one_line_and_caches_nothing(
    kind, reply, pattern, tmp_path, tiny_target, prompts_file
):
    workdir = tmp_path / "wd"
    job = workdir / "jobs" / "job-1"
    job.mkdir(parents=True)
    with ScriptedServer(reply) as server:
        spec = {
            "kind": "eval",
            "eval": {"target": str(tiny_target), "dtype": "float32"},
            "workdir": str(workdir),
            "prompts": {"path": str(prompts_file)},
            "samples": 2,
            "seed": 0,
            "sampling": {"temperature": 0.0, "max_new_tokens": 4},
            "ground_truth": {"kind": kind, "url": server.url, "timeout": 20},
            "stop_after": "ground_truth",
        }
        (job / "spec.json").write_text(json.dumps(spec))
        code = _run_job(job)
    # 3: a UserError, one line in exit.json (a bug would be 1, with a traceback in the log)
    assert code == 3
    end = json.loads((job / "exit.json").read_text())
    assert end["state"] == "failed" and "\n" not in end["error"]
    assert server.url in end["error"], end["error"]  # the line names the server
    assert re.search(pattern, end["error"]), end["error"]
    assert not list((workdir / "groundtruth").iterdir())  # nothing cached, nothing half-written
    assert not (job / "ground_truth.json").exists() and not (job / "result.json").exists()
