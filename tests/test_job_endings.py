"""A job's runner that dies without saying so still says why: killed by which signal, out of
memory where the kernel says so, and where its log is, in the job's ``exit.json`` and in
the one line ``dflash remote-eval`` ends with. Real jobs on a local eval host, killed for
real (``kill -9``; the kernel's OOM killer in a memory cgroup of the test's own)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.cgroups import memory_cgroup
from tests.helpers.cli import ROOT, dflash

pytestmark = pytest.mark.slow


@pytest.fixture
def host(tmp_path, tiny_target, trained_drafters):
    """A local eval host ``here`` (its python: `python`, default this one), the tiny
    target and drafters, and a ground truth long enough that the job is still running
    when the test kills it."""
    gt = tmp_path / "long.jsonl"
    rng = random.Random(0)
    gt.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"long-{i}",
                    "prompt_ids": [rng.randrange(8, 300) for _ in range(16)],
                    "completion_ids": [rng.randrange(8, 300) for _ in range(300)],
                }
            )
            + "\n"
            for i in range(60)
        )
    )

    def make(python: str = sys.executable) -> Path:
        inv = tmp_path / "inventory.yaml"
        inv.write_text(
            json.dumps(
                {
                    "hosts": {
                        "here": {
                            "transport": "local",
                            "python": python,
                            "workdir": str(tmp_path / "work"),
                            "roles": {
                                "eval": {
                                    "drafters": str(trained_drafters),
                                    "target_model": str(tiny_target),
                                    "ground_truth": str(gt),
                                    "ground_truth_kind": "file",
                                    "dtype": "float32",
                                    "threads": 1,
                                }
                            },
                        }
                    },
                    "defaults": {"eval_host": "here", "results_dir": str(tmp_path / "res")},
                }
            )
        )
        return inv

    make.jobs = tmp_path / "work" / "jobs"
    return make


def _eval(inv: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    argv = [sys.executable, "-m", "orchestrator", "remote-eval", "-c", "step-12", "-i", str(inv)]
    argv += ["--budgets", "8"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(predicate, what: str, limit: float = 240.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _running_job(jobs: Path, cli: subprocess.Popen) -> Path:
    """The job folder once its runner evaluates samples."""

    def sampling():
        if cli.poll() is not None:
            raise AssertionError(f"the eval ended first: {cli.communicate()[1][-2000:]}")
        for job in jobs.glob("*") if jobs.is_dir() else []:
            events = job / "events.jsonl"
            if events.is_file() and '"event": "sample"' in events.read_text():
                return job
        return None

    return _wait_for(sampling, "the job's first evaluated sample")


def _ended(cli: subprocess.Popen) -> tuple[int, str]:
    _out, err = cli.communicate(timeout=240)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return cli.returncode, lines[-1] if lines else ""


def _runner_pid(job: Path) -> int:
    """The pid of the process that runs the job's work: the supervisor's forked runner."""
    supervisor = json.loads((job / "pid.json").read_text())["pid"]
    kids = psutil.Process(supervisor).children()
    return kids[0].pid if kids else supervisor


def test_a_runner_killed_by_sigkill_says_so_with_its_log(host):
    """Before: ``job ... lost (log: dflash jobs list --host here)``, no signal, no log."""
    cli = _eval(host())
    job = _running_job(host.jobs, cli)
    os.kill(_runner_pid(job), signal.SIGKILL)
    code, line = _ended(cli)
    assert code != 0
    record = json.loads((job / "exit.json").read_text())
    assert record["state"] == "failed" and record["code"] == 137
    assert record["signal"] == "SIGKILL" and record["oom"] is False
    assert record["log"] == str(job / "log.txt")
    assert line.startswith(f"error: job {job.name} on here failed: ") and record["error"] in line
    assert "was killed by SIGKILL" in line and f"log: {job}/log.txt" in line


def test_a_job_killed_with_its_supervisor_says_it_was_lost_and_where_its_log_is(host):
    """The whole process group killed at once: nobody could write exit.json; the line
    says the job ended without a word, by what it may have been, and where its log is."""
    cli = _eval(host())
    job = _running_job(host.jobs, cli)
    os.killpg(json.loads((job / "pid.json").read_text())["pgid"], signal.SIGKILL)
    code, line = _ended(cli)
    assert code != 0
    assert line.startswith(f"error: job {job.name} on here lost: the job's runner (pid "), line
    assert "ended without recording how: killed together with its supervisor" in line
    assert f"log: {job}/log.txt" in line


def test_a_killed_watch_is_never_an_empty_line(host):
    """The host-side watch that streams the job's events killed: before, ``here: remote
    job watch failed (exit 137): `` and nothing after the colon."""
    cli = _eval(host())
    job = _running_job(host.jobs, cli)
    watchers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "--follow" in (p.info["cmdline"] or []) and f"--job-id={job.name}" in p.info["cmdline"]
    ]
    assert watchers
    for p in watchers:
        p.kill()
    try:
        code, line = _ended(cli)
        assert code != 0
        assert line.startswith(f"error: here: job watch of {job.name} ended before it answered")
        assert "killed by SIGKILL" in line, line
        assert f"the job keeps running: dflash jobs attach {job.name} --host here" in line
    finally:
        dflash("jobs", "cancel", job.name, "-i", str(host.jobs.parent.parent / "inventory.yaml"))


def test_a_runner_the_oom_killer_ends_says_out_of_memory(host, tmp_path):
    """The job's processes in a memory cgroup too small for the runner's torch: the
    kernel's OOM killer ends the runner, and the line and the exit record say so."""
    with memory_cgroup(200 * 2**20, f"dflash-test-{os.getpid()}") as cgroup:
        if cgroup is None:
            pytest.skip("no memory cgroup can be made here (root and a memory controller)")
        python = tmp_path / "python-in-cgroup"
        python.write_text(
            f'#!/bin/sh\necho $$ > "{cgroup}/cgroup.procs" && exec {sys.executable} "$@"\n'
        )
        python.chmod(0o755)
        code, line = _ended(_eval(host(str(python))))
    assert code != 0
    assert "during its host checks, the job's runner (pid " in line, line
    assert "was killed by SIGKILL (out of memory" in line, line
    (job,) = list(host.jobs.iterdir())  # kept: its log is named
    record = json.loads((job / "exit.json").read_text())
    assert record["oom"] is True and record["signal"] == "SIGKILL" and record["error"] in line
    assert f"log: {job}/log.txt" in line


def test_a_supervisor_killed_alone_takes_its_runner_along(host):
    """No runner works on unwatched: the supervisor killed outright, its runner dies with it
    (Linux's parent-death signal) and the job is lost, its line saying how it may have been."""
    cli = _eval(host())
    job = _running_job(host.jobs, cli)
    runner = psutil.Process(_runner_pid(job))
    os.kill(json.loads((job / "pid.json").read_text())["pid"], signal.SIGKILL)
    runner.wait(timeout=60)
    code, line = _ended(cli)
    assert code != 0
    assert line.startswith(f"error: job {job.name} on here lost: the job's runner (pid "), line
    assert f"log: {job}/log.txt" in line
