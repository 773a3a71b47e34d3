"""`dflash follow` over real loopback sshd hosts: a trainer that gains checkpoints while
follow runs, an eval host with a real ground-truth HTTP server, real tiny drafters.

"Evaluated exactly once" is checked where it happens: by counting the jobs on the eval host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from orchestrator.eval.follow.loop import FollowEvents
from tests.helpers.checkpoints import without_tokenizer
from tests.helpers.cli import ROOT, dflash, one_error_line
from tests.helpers.sshd import ssh_host_entry

pytestmark = pytest.mark.slow
DEADLINE = 600  # a hang guard for polling, never a speed assertion


@pytest.fixture(scope="module")
def drafter_ckpts(tiny_target, tmp_path_factory) -> dict[str, Path]:
    """Three checkpoints of a tiny drafter trained for real on the tiny target."""
    from orchestrator.demo.train import train_drafter

    out = tmp_path_factory.mktemp("follow-drafters")
    paths = train_drafter(
        str(tiny_target),
        str(out),
        save_steps=(0, 20, 60),
        samples=6,
        batch_samples=3,
        completion_len=24,
    )
    return {Path(p).name: Path(p) for p in paths}


class Setup:
    def __init__(
        self,
        inventory: Path,
        ckpts: Path,
        drafters: Path,
        workdir: Path,
        results: Path,
        sources: dict[str, Path],
    ):
        self.inventory, self.ckpts, self.drafters = inventory, ckpts, drafters
        self.workdir, self.results, self.sources = workdir, results, sources
        self.state = results / "follow" / "trainer-to-evalhost"

    def write(self, name: str, complete: bool = True) -> None:
        """Write a checkpoint as a trainer does: files first, the COMPLETE marker last."""
        shutil.copytree(self.sources[name], self.ckpts / name)
        if complete:
            self.complete(name)

    def complete(self, name: str) -> None:
        (self.ckpts / name / "COMPLETE").write_text("")

    def history(self) -> list[dict]:
        path = self.state / "history.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def inflight(self) -> dict:
        path = self.state / "state.json"
        return json.loads(path.read_text())["inflight"] if path.is_file() else {}

    def jobs(self) -> list[dict]:
        """Every job on the eval host (its own workdir), read from the job folders there."""
        root = self.workdir / "jobs"
        out = []
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            spec = json.loads((d / "spec.json").read_text())
            exit_ = (
                json.loads((d / "exit.json").read_text()) if (d / "exit.json").is_file() else None
            )
            out.append(
                {
                    "job_id": d.name,
                    "checkpoint": spec["checkpoint"],
                    "state": (exit_ or {}).get("state", "running"),
                }
            )
        return out

    def follow(self, *args: str) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
        log = open(self.results.parent / f"follow-{time.monotonic_ns()}.log", "w")
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "follow",
                "-i",
                str(self.inventory),
                "--budgets",
                "4",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )


@pytest.fixture
def setup(
    trainer_sshd,
    eval_sshd,
    ssh_base,
    make_inventory,
    gt_server,
    tiny_target,
    drafter_ckpts,
    tmp_path,
):
    gt_server.mode = "ok"
    tag = tmp_path.name[-24:]
    ckpts = trainer_sshd.root / f"ckpts-{tag}"
    drafters = eval_sshd.root / f"drafters-{tag}"
    workdir = eval_sshd.root / f"wd-{tag}"  # its own jobs folder: counts are this test's
    ckpts.mkdir()
    drafters.mkdir()
    results = tmp_path / "results"
    inv = make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                trainer_sshd,
                ssh_base,
                roles={"trainer": {"checkpoints": str(ckpts), "complete_rule": "marker"}},
            ),
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                workdir=str(workdir),
                roles={
                    "eval": {
                        "drafters": str(drafters),
                        "target_model": str(tiny_target),
                        "ground_truth": gt_server.url,
                        "ground_truth_kind": "sglang",
                        "samples": 2,
                        "max_new_tokens": 12,
                        "dtype": "float32",
                        "threads": 1,
                    }
                },
            ),
        },
        defaults={"relay_from": "trainer", "relay_to": "evalhost", "results_dir": str(results)},
    )
    yield Setup(inv, ckpts, drafters, workdir, results, drafter_ckpts)
    gt_server.mode = "ok"


def wait_for(predicate, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"follow exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.3)


def watching(setup: Setup) -> bool:
    """True once a job is in its ground-truth phase and follow is (almost surely) inside its
    long-running watch command. Signals are sent then, not while a remote command starts:
    on this machine a remote login shell runs `pyenv rehash`, and killing one mid-rehash
    leaves pyenv's lock behind, which stalls every later ssh command by a minute."""
    for events in (setup.workdir / "jobs").glob("*/events.jsonl"):
        if '"phase"' in events.read_text():
            time.sleep(1.0)  # let the watch command get past its shell start-up
            return True
    return False


def job_processes(workdir: Path) -> list[psutil.Process]:
    """Live processes of the jobs under `workdir` (by the process groups they recorded). A
    zombie has ended: only its reaping is left, to whichever init adopted it."""
    groups = set()
    for pid_file in (workdir / "jobs").glob("*/pid.json"):
        groups.add(json.loads(pid_file.read_text())["pgid"])
    alive = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in groups and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def per_checkpoint(jobs: list[dict]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for j in jobs:
        out.setdefault(j["checkpoint"], []).append(j["state"])
    return out


def test_follow_evaluates_each_new_checkpoint_once_across_a_restart(setup):
    setup.write("step-0")
    # Between passes follow only waits: the stop below lands there, not inside an ssh command.
    proc = setup.follow("--interval", "4")
    try:
        wait_for(lambda: len(setup.history()) >= 1, proc, "step-0 in the history")
        # The trainer moves on while follow runs: one finished, one still being written.
        setup.write("step-20")
        setup.write("step-60", complete=False)
        wait_for(lambda: len(setup.history()) >= 2, proc, "step-20 in the history")
        proc.send_signal(signal.SIGINT)  # a clean stop while it waits for the trainer
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [h["checkpoint"] for h in setup.history()] == ["step-0", "step-20"]
    assert per_checkpoint(setup.jobs()) == {"step-0": ["done"], "step-20": ["done"]}
    assert not (setup.drafters / "step-60").exists()  # incomplete: never relayed

    # Restart: the trainer finished step-60 meanwhile; one pass, keeping the newest 2.
    setup.complete("step-60")
    again = setup.follow("--once", "--keep", "2", "--json")
    assert again.wait(timeout=DEADLINE) == 0
    history = setup.history()
    assert [(h["step"], h["checkpoint"], h["state"]) for h in history] == [
        (0, "step-0", "done"),
        (20, "step-20", "done"),
        (60, "step-60", "done"),
    ]
    for h in history:
        assert all(isinstance(h[k], float) for k in ("tau_per_sample_mean", "tau_token_weighted"))
        assert set(h["ddtree"]) == {"4"} and h["run_id"] == h["job_id"]
        assert (Path(h["run_dir"]) / "result.json").is_file() and h["time"]
    assert per_checkpoint(setup.jobs()) == {
        "step-0": ["done"],
        "step-20": ["done"],
        "step-60": ["done"],
    }
    assert sorted(p.name for p in setup.drafters.iterdir() if not p.name.startswith(".")) == [
        "step-20",
        "step-60",
    ]  # --keep 2 through the relay
    assert (setup.state / "tau_by_step.png").stat().st_size > 1000
    assert setup.inflight() == {}

    # A pass with nothing new evaluates nothing.
    third = setup.follow("--once")
    assert third.wait(timeout=DEADLINE) == 0
    assert len(setup.jobs()) == 3 and len(setup.history()) == 3
    assert job_processes(setup.workdir) == []


def test_follow_killed_mid_eval_attaches_to_its_job_after_restart(setup, gt_server):
    from orchestrator.eval.follow import loop as follow
    from orchestrator.inventory import load_inventory

    gt_server.mode, gt_server.delay = "slow", 4.0  # keeps the job in its first phase a while
    setup.write("step-0")
    proc = setup.follow("--interval", "1")
    try:
        wait_for(lambda: setup.inflight() and watching(setup), proc, "the eval job to run")
        proc.kill()  # a crash: no chance to cancel anything
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    started = setup.inflight()["step-0"]["job_id"]
    assert [j["job_id"] for j in setup.jobs()] == [started]
    gt_server.mode = "ok"

    recorded = follow.follow_pass(
        load_inventory(setup.inventory), "trainer", "evalhost", follow.FollowOptions()
    )
    assert [(e["checkpoint"], e["job_id"], e["state"]) for e in recorded] == [
        ("step-0", started, "done")
    ]
    assert per_checkpoint(setup.jobs()) == {"step-0": ["done"]}  # attached, not restarted
    assert setup.inflight() == {}

    # What a crash between the eval and the history write leaves: the job done, its note in
    # state.json, no history entry. The next pass pulls that job's result; no new job.
    state = json.loads((setup.state / "state.json").read_text())
    state["inflight"] = {"step-0": {"job_id": started, "step": 0}}
    (setup.state / "state.json").write_text(json.dumps(state))
    (setup.state / "history.json").write_text("[]")
    shutil.rmtree(setup.results / started)
    again = follow.follow_pass(load_inventory(setup.inventory), "trainer", "evalhost")
    assert [(e["checkpoint"], e["job_id"]) for e in again] == [("step-0", started)]
    assert (setup.results / started / "result.json").is_file()
    assert per_checkpoint(setup.jobs()) == {"step-0": ["done"]}
    assert [h["checkpoint"] for h in setup.history()] == ["step-0"]


def test_ctrl_c_cancels_the_running_job_and_a_restart_evaluates_afresh(setup, gt_server):
    gt_server.mode, gt_server.delay = "slow", 4.0
    setup.write("step-0")
    proc = setup.follow("--interval", "1")
    try:
        wait_for(lambda: watching(setup), proc, "the eval job to run")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130
    assert per_checkpoint(setup.jobs()) == {"step-0": ["cancelled"]}
    assert job_processes(setup.workdir) == []
    assert setup.inflight() == {} and setup.history() == []
    # The relay had finished: one published checkpoint, no partial folder.
    assert sorted(p.name for p in setup.drafters.iterdir()) == ["step-0"]

    gt_server.mode = "ok"
    again = setup.follow("--once")
    assert again.wait(timeout=DEADLINE) == 0
    assert [h["checkpoint"] for h in setup.history()] == ["step-0"]
    assert sorted(per_checkpoint(setup.jobs())["step-0"]) == ["cancelled", "done"]


def test_a_second_follower_on_the_same_folder_is_refused(setup):
    from orchestrator.eval.follow import loop as follow
    from orchestrator.inventory import load_inventory

    inv = load_inventory(setup.inventory)
    holder = follow.FollowState(follow.state_dir(inv, "trainer", "evalhost"), "trainer", "evalhost")
    try:
        with pytest.raises(follow.FollowError, match="another dflash follow"):
            follow.follow_pass(inv, "trainer", "evalhost")
    finally:
        holder.close()
    assert setup.jobs() == []


# ---- friction: runs already there, one waiting line, a clean SIGTERM, no tokenizer --------


def test_follow_records_checkpoints_remote_eval_already_evaluated_with_its_spec(setup):
    """Issue 24.7: `follow --once` evaluated again what `remote-eval` had evaluated with the
    very same settings (5 runs for 3 checkpoints). A run in the results folder of the same
    checkpoint, relayed from this trainer, with the same eval spec is recorded from; one
    with other settings is not."""
    from orchestrator.inventory import load_inventory
    from orchestrator.relay import run as relay

    setup.write("step-0")
    setup.write("step-20")
    report = relay.relay(
        load_inventory(setup.inventory), "trainer", ["evalhost"], relay.RelayOptions(all=True)
    )
    assert report.ok
    inv = str(setup.inventory)
    same = dflash("remote-eval", "-c", "step-0", "--budgets", "4", "-i", inv, "--json")
    assert same.returncode == 0, same.stderr
    run_id = json.loads(same.stdout)["run_id"]
    other = dflash(
        "remote-eval", "-c", "step-20", "--budgets", "4", "--max-new-tokens", "6", "-i", inv
    )
    assert other.returncode == 0, other.stderr

    again = setup.follow("--once")
    assert again.wait(timeout=DEADLINE) == 0
    history = {h["checkpoint"]: h for h in setup.history()}
    assert history["step-0"]["run_id"] == history["step-0"]["job_id"] == run_id
    assert history["step-0"]["state"] == "done" and history["step-20"]["state"] == "done"
    assert history["step-20"]["run_id"] != run_id
    # step-0: remote-eval's job only; step-20: remote-eval's, and follow's with its own spec
    assert {k: len(v) for k, v in per_checkpoint(setup.jobs()).items()} == {
        "step-0": 1,
        "step-20": 2,
    }


class Said(FollowEvents):
    """Every line follow says, in order."""

    def __init__(self):
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def test_follow_says_waiting_once_not_every_pass(setup):
    """Issue 24.8: `follow --interval 5` printed a waiting line every pass (~100 lines in
    10 minutes). The status lines are said once, and again only when they change."""
    from orchestrator.eval.follow import loop as follow
    from orchestrator.inventory import load_inventory

    setup.write("step-60", complete=False)  # on the trainer, not complete: said once too
    said, passes = Said(), []
    stop = threading.Event()

    def sleep(seconds: float) -> None:
        passes.append(seconds)
        if len(passes) == 4:
            stop.set()

    follow.follow(
        load_inventory(setup.inventory),
        "trainer",
        "evalhost",
        follow.FollowOptions(interval=0.5),
        said,
        stop,
        sleep,
    )
    assert len(passes) == 4
    assert said.lines == [
        "not complete yet: step-60",
        "waiting for new checkpoints (looking every 0.5s)",
    ]
    assert setup.jobs() == []


def test_sigterm_ends_follow_with_one_line_and_exit_143(setup):
    """Issue 24.8: SIGTERM ended follow with rc 130 and no line. It ends as the shell
    reports a SIGTERM'd command (143), with one line saying the history is kept."""
    proc = setup.follow("--interval", "30")
    try:
        wait_for(lambda: "for new checkpoints" in _log(setup), proc, "the waiting line")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in _log(setup).splitlines() if ln.strip()]
    assert "Traceback" not in _log(setup)
    assert lines[-1] == "terminated; the history is kept: run dflash follow again to go on"


def _log(setup: Setup) -> str:
    """What the newest follow subprocess of `setup` printed so far."""
    logs = sorted(setup.results.parent.glob("follow-*.log"))
    return logs[-1].read_text() if logs else ""


def test_follow_refuses_a_target_without_tokenizer_before_relaying(setup, eval_sshd, tiny_target):
    """A target folder without tokenizer files made every prompt [] and the eval died in
    generate; follow now asks the eval host first and stops with its one line, in a loop
    as with --once: nothing relayed, no job, no history."""
    notok = without_tokenizer(tiny_target, eval_sshd.root / "follow-no-tokenizer")
    doc = yaml.safe_load(setup.inventory.read_text())
    doc["hosts"]["evalhost"]["roles"]["eval"]["target_model"] = str(notok)
    setup.inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    setup.write("step-0")
    for how in (["--once"], ["--interval", "1"]):
        proc = dflash("follow", "-i", str(setup.inventory), *how, timeout=300)
        assert proc.returncode != 0, how
        line = one_error_line(proc)
        assert f"evalhost: target folder {notok} has no tokenizer" in line, (how, line)
        assert "--ground-truth-kind file" in line
    assert setup.jobs() == [] and setup.history() == []
    assert not (setup.drafters / "step-0").exists()
