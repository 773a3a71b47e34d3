"""`dflash remote-eval`, `dflash jobs` and `dflash results` end to end over a real loopback
sshd eval host, with a tiny real target, tiny trained drafter checkpoints and a real
ground-truth HTTP server answering with the target's greedy ids."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from remote.protocol import EvalSpec
from tests.helpers.checkpoints import without_tokenizer
from tests.helpers.cli import ROOT, dflash, one_error_line
from tests.helpers.images import png_size
from tests.helpers.sshd import account_home, ssh_host_entry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def eval_models(eval_sshd, tiny_target):
    """Two checkpoints of a tiny drafter trained for real, in the eval host's drafters
    folder (the host's files live under the sshd's root)."""
    from orchestrator.demo.train import train_drafter

    drafters = eval_sshd.root / "reval-drafters"
    train_drafter(
        str(tiny_target),
        str(drafters),
        save_steps=(0, 12),
        samples=6,
        batch_samples=3,
        completion_len=24,
    )
    return {"target": tiny_target, "drafters": drafters}


def eval_inventory(
    make_inventory, eval_sshd, ssh_base, eval_models, gt_server, results: Path, **host
) -> Path:
    """An inventory whose eval host is the loopback sshd with the tiny models and the
    scripted ground-truth server; `host`: more keys of its entry (e.g. ``workdir``)."""
    return make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                roles={
                    "eval": {
                        "drafters": str(eval_models["drafters"]),
                        "target_model": str(eval_models["target"]),
                        "ground_truth": gt_server.url,
                        "ground_truth_kind": "sglang",
                        "dtype": "float32",
                    }
                },
                **host,
            )
        },
        defaults={"eval_host": "evalhost", "results_dir": str(results)},
    )


@pytest.fixture
def inventory(eval_sshd, ssh_base, make_inventory, eval_models, gt_server, tmp_path):
    return eval_inventory(
        make_inventory, eval_sshd, ssh_base, eval_models, gt_server, tmp_path / "results"
    )


def workdir(eval_sshd) -> Path:
    return eval_sshd.root / "dflash"


def job_dirs(eval_sshd) -> set[str]:
    jobs = workdir(eval_sshd) / "jobs"
    return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()


def test_remote_eval_pulls_results_second_run_reuses_bundle_and_ground_truth(
    inventory, eval_sshd, server, tmp_path
):
    import shutil

    shutil.rmtree(workdir(eval_sshd) / "bundles", ignore_errors=True)
    first = dflash(
        "remote-eval",
        "--checkpoint",
        "step-0",
        "--samples",
        "3",
        "--max-new-tokens",
        "16",
        "--budgets",
        "4,8",
        "-i",
        str(inventory),
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    assert "(bundle pushed)" in first.stderr
    assert "tau (z-lab" in first.stdout and "results:" in first.stdout
    bundles = list((workdir(eval_sshd) / "bundles").iterdir())
    assert len(bundles) == 1
    stamp = bundles[0].stat().st_mtime_ns
    asked = len(server.requests)
    assert asked == 3  # one /generate per prompt

    second = dflash(
        "remote-eval",
        "--checkpoint",
        "step-12",
        "--samples",
        "3",
        "--max-new-tokens",
        "16",
        "--budgets",
        "4,8",
        "-i",
        str(inventory),
        "--json",
        timeout=300,
    )
    assert second.returncode == 0, second.stderr
    assert "bundle pushed" not in second.stderr
    assert bundles[0].stat().st_mtime_ns == stamp
    assert len(server.requests) == asked  # ground truth came from the host's cache
    out = json.loads(second.stdout)
    run_dir = Path(out["run_dir"])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["schema"] == "dflash.eval/1"
    assert result["metrics"]["samples"] == 3
    src = result["inputs"]["ground_truth_source"]
    assert src["kind"] == "sglang" and src["url"] == server.url and src["cached"] is True
    # Which source made the cached ground truth: this server, this model, at the first run.
    made = src["source"]
    assert made["url"] == f"{server.url}/generate" and made["model"] == server.model_path
    assert made["made"] < result["job"]["created"]
    assert result["inputs"]["dtype"] == "float32" and result["inputs"]["eval_engine"]
    assert out["summary"]["checkpoint"] == "step-12" and out["summary"]["step"] == 12
    for name in ("samples.jsonl", "spec.json", "ground_truth.json", "exit.json"):
        assert (run_dir / name).is_file(), name
    for name in ("acceptance_histogram.png", "per_position_acceptance.png"):
        w, h = png_size(run_dir / name)
        assert w >= 300 and h >= 200
    w, _ = png_size(run_dir.parent / "tau_by_step.png")
    assert w >= 300

    listed = dflash("results", "list", "-i", str(inventory), "--json")
    runs = json.loads(listed.stdout)
    assert [r["checkpoint"] for r in runs] == ["step-0", "step-12"]
    a, b = runs[0]["run_id"], runs[1]["run_id"]
    compare = dflash("results", "compare", a, b, "-i", str(inventory))
    assert compare.returncode == 0, compare.stderr
    assert a in compare.stdout and b in compare.stdout
    tau_row = next(ln for ln in compare.stdout.splitlines() if "tau (z-lab" in ln)
    assert all(f"{r['tau_per_sample_mean']:.3f}" in tau_row for r in runs), tau_row
    assert "DDTree-8 tau" in compare.stdout
    assert not (run_dir.parent / "compare_tau_by_step.png").exists()  # only where asked
    plot = run_dir.parent.parent / "compare.png"
    compare_json = json.loads(
        dflash(
            "results", "compare", a, b, "-i", str(inventory), "--json", "--plot", str(plot)
        ).stdout
    )
    assert compare_json["runs"] == [a, b] and compare_json["plot"] == str(plot)
    png_size(plot)
    show = dflash("results", "show", b, "-i", str(inventory))
    assert show.returncode == 0, show.stderr
    for section in (
        "DDTree budgets",
        "acceptance histogram",
        "per-position acceptance",
        "target agreement",
        "timings",
        "environment",
        "ground truth source",
    ):
        assert section in show.stdout, section


def test_an_eval_is_one_ssh_command_after_connecting_and_pulls_checked_files(
    inventory, eval_sshd, monkeypatch, tmp_path
):
    """With the bundle on the host, `run_eval` sends ONE command: it carries the prompts
    (written on the host, content-addressed), starts the job, streams its events and
    carries its result files back; a later pull is one command; files a host names outside
    the result set are never written, and garbled ones are refused in one line."""
    from orchestrator.errors import RemoteCommandError
    from orchestrator.eval import pull, run
    from orchestrator.inventory import load_inventory
    from orchestrator.transport import hosts

    inv = load_inventory(inventory)
    options = run.EvalOptions(samples=2, max_new_tokens=8, engine=EvalSpec(budgets=(4,)))
    run.run_eval(inv, None, "step-0", options)  # bundle and prompts now on the host
    sent: list[str] = []
    real_popen = hosts.SSHHost.popen

    def popen(self, command):
        sent.append(hosts.command_line(command))
        return real_popen(self, command)

    monkeypatch.setattr(hosts.SSHHost, "popen", popen)
    events: list[dict] = []
    shutil.rmtree(workdir(eval_sshd) / "prompts")  # the start itself carries them
    run_dir = run.run_eval(inv, None, "step-0", options, on_event=events.append)
    assert len(sent) == 1, sent
    assert "job start" in sent[0] and "--follow" in sent[0] and "--pull" in sent[0]
    spec = json.loads((run_dir / "spec.json").read_text())
    assert "carry" not in spec  # the carried bytes are not part of the job's record
    prompts = Path(spec["prompts"]["path"])
    assert prompts.parent == workdir(eval_sshd) / "prompts"
    assert hashlib.sha256(prompts.read_bytes()).hexdigest() == spec["prompts"]["sha256"]
    assert [e["event"] for e in events if e["event"] in ("job", "done", "end")] == [
        "job",
        "done",
        "end",
    ]
    names = {p.name for p in run_dir.iterdir()}
    assert {"result.json", "samples.jsonl", "spec.json", "events.jsonl", "pulled.json"} <= names
    job_dir = workdir(eval_sshd) / "jobs" / run_dir.name
    assert (run_dir / "samples.jsonl").read_bytes() == (job_dir / "samples.jsonl").read_bytes()
    # The host checks say where the job's start-up went (torch + transformers, then the
    # target's modeling code and meta model, the checks around them), for benchmarks/eval.py.
    seconds = json.loads((job_dir / "preflight.json").read_text())["seconds"]
    assert set(seconds) == {"before_s", "import_s", "describe_s", "after_s"}
    assert all(v >= 0 for v in seconds.values()) and seconds["describe_s"] > 0

    sent.clear()
    with hosts.open_host(inv.host("evalhost"), inv) as host:
        again = pull.pull_results(host, run_dir.name, tmp_path / "again")
        assert len(sent) == 1  # `job pull`, run only if the bundle is there
        assert (again / "result.json").read_bytes() == (run_dir / "result.json").read_bytes()
        real = base64.b64encode((run_dir / "result.json").read_bytes()).decode()
        forged = {
            "has_result": True,
            "dir": str(job_dir),
            "files": {"result.json": real, "../../outside.json": "e30="},
        }
        out = pull.pull_results(host, "forged", tmp_path / "forged", forged)
        assert sorted(p.name for p in out.iterdir()) == ["pulled.json", "result.json"]
        assert not (tmp_path / "outside.json").exists()
        forged["files"] = {"result.json": "not base64!"}
        with pytest.raises(RemoteCommandError, match="result.json arrived garbled"):
            pull.pull_results(host, "garbled", tmp_path / "garbled", forged)
        assert not (tmp_path / "garbled" / "garbled").exists()


def test_a_home_relative_workdir_costs_no_home_lookup(
    eval_sshd, ssh_base, make_inventory, eval_models, gt_server, tmp_path, monkeypatch
):
    """The default workdir is ``~/.dflash``: its ``~`` (in the job start, the carried
    prompts' path, every later job command) is left to the host, so an eval with the bundle
    there does not ask the host for its home, a whole command, before its first one. The
    job records the expanded paths."""
    from orchestrator.eval import run
    from orchestrator.inventory import load_inventory
    from orchestrator.transport import hosts

    name = f".dflash-test-{os.getpid()}-eval"
    inv_path = eval_inventory(
        make_inventory,
        eval_sshd,
        ssh_base,
        eval_models,
        gt_server,
        tmp_path / "results",
        workdir=f"~/{name}",
    )
    looked_up: list[str] = []
    real_home = hosts.Host.home

    def home(self):
        looked_up.append(self.name)
        return real_home.fget(self)

    monkeypatch.setattr(hosts.Host, "home", property(home))
    home_dir = account_home()  # the loopback host's user is this one
    try:
        options = run.EvalOptions(samples=2, max_new_tokens=8, engine=EvalSpec(budgets=(4,)))
        run.run_eval(load_inventory(inv_path), None, "step-0", options)  # pushes the bundle
        looked_up.clear()  # (a push, by sftp, needs the real path: once per bundle)
        run_dir = run.run_eval(load_inventory(inv_path), None, "step-0", options)
        assert looked_up == []
        spec = json.loads((run_dir / "spec.json").read_text())
        assert spec["workdir"] == str(home_dir / name)
        prompts = Path(spec["prompts"]["path"])
        assert prompts.parent == home_dir / name / "prompts" and prompts.is_file()
        assert (home_dir / name / "jobs" / run_dir.name / "result.json").is_file()
    finally:
        shutil.rmtree(home_dir / name, ignore_errors=True)


def test_carried_files_are_checked_before_a_job_starts(tmp_path):
    """A job start writes the files it carries only as plain names inside the workdir's
    prompts/ or groundtruth/shards/, whole and matching their sha256; anything else is
    one line, and no job folder, process or file outside is made."""
    from remote.errors import UserError
    from remote.jobs import start as jobs

    workdir = tmp_path / "wd"
    data = b'{"prompt": "hi"}\n'
    good = {
        "path": str(workdir / "prompts" / "abc-chat.jsonl"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "data": base64.b64encode(data).decode(),
    }
    (tmp_path / "elsewhere").mkdir()
    (workdir / "prompts").mkdir(parents=True)
    (workdir / "prompts" / "link").symlink_to(tmp_path / "elsewhere")
    bad = [
        ({**good, "path": str(tmp_path / "outside.jsonl")}, "is not a plain name"),
        ({**good, "path": str(workdir / "prompts" / ".." / "x.jsonl")}, "is not a plain name"),
        ({**good, "path": str(workdir / "prompts" / "link" / "x.jsonl")}, "is not a plain"),
        ({**good, "sha256": "0" * 64}, "does not match its sha256"),
        ({**good, "data": "not base64!"}, "is not base64"),
        ({"path": good["path"]}, "needs path, sha256 and data"),
    ]
    for item, message in bad:
        with pytest.raises(UserError, match=message):
            jobs.start(str(workdir), "j1", {"kind": "eval", "carry": [good, item]})
        assert not (workdir / "jobs" / "j1").exists()
        assert not (workdir / "prompts" / "abc-chat.jsonl").exists()  # none of the list
    assert not (tmp_path / "outside.jsonl").exists()
    assert list((tmp_path / "elsewhere").iterdir()) == []
    written = jobs.write_carried(str(workdir), [good])
    assert written == [workdir.resolve() / "prompts" / "abc-chat.jsonl"]
    assert written[0].read_bytes() == data


def test_a_deferred_ground_truth_is_awaited_and_its_absence_is_one_line(tmp_path):
    """A job whose file ground truth is deferred waits for it in its folder (pushed whole,
    by a rename) and fails in one line when it does not come in time."""
    import threading

    from remote.errors import UserError
    from remote.eval import job as jobs
    from remote.protocol import GT_DEFERRED_FILE

    target = tmp_path / GT_DEFERRED_FILE
    with pytest.raises(UserError, match="did not arrive in 0.2s.*controller stopped"):
        jobs.await_file(target, 0.2)
    threading.Timer(0.3, lambda: target.write_text("{}\n")).start()
    assert jobs.await_file(target, 10.0) == target


def test_a_late_ground_truth_has_the_target_load_meanwhile_and_a_prompt_one_not(tmp_path):
    """The job's load starts once the deferred ground truth is later than `after` (it is
    being made), and never for one that comes sooner (it was cached: the engine then loads
    only what it needs)."""
    import threading

    from remote.eval import job as jobs

    calls: list[float] = []
    began = time.monotonic()
    late = tmp_path / "late.jsonl"
    threading.Timer(0.6, lambda: late.write_text("{}\n")).start()
    got = jobs.await_file(late, 10.0, meanwhile=lambda: calls.append(time.monotonic()), after=0.2)
    assert got == late and len(calls) == 1 and 0.2 <= calls[0] - began < 0.6
    prompt = tmp_path / "prompt.jsonl"
    threading.Timer(0.05, lambda: prompt.write_text("{}\n")).start()
    assert jobs.await_file(prompt, 10.0, meanwhile=lambda: calls.append(0.0), after=2.0) == prompt
    assert len(calls) == 1


def _wait_for(predicate, what: str, limit: float = 240.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _events(eval_sshd, job: str) -> list[dict]:
    path = workdir(eval_sshd) / "jobs" / job / "events.jsonl"
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def test_killed_cli_leaves_job_running_and_attach_pulls_it(inventory, eval_sshd, server):
    before = job_dirs(eval_sshd)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "remote-eval",
            "--checkpoint",
            "step-12",
            "--samples",
            "8",
            "--max-new-tokens",
            "40",
            "--prompts",
            "code",
            "--positions",
            "all",
            "-i",
            str(inventory),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job = _wait_for(lambda: next(iter(job_dirs(eval_sshd) - before), None), "the job folder")
    _wait_for(
        lambda: any(e["event"] == "ground_truth" for e in _events(eval_sshd, job)),
        "ground-truth progress",
    )
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    assert not (workdir(eval_sshd) / "jobs" / job / "exit.json").exists()  # killed mid-run

    attached = dflash("jobs", "attach", job, "-i", str(inventory), "--json", timeout=300)
    assert attached.returncode == 0, attached.stderr
    out = json.loads(attached.stdout)
    assert out["run_id"] == job
    result = json.loads((Path(out["run_dir"]) / "result.json").read_text())
    assert result["metrics"]["samples"] == 8
    assert result["inputs"]["positions"] == "all"
    events = [e["event"] for e in _events(eval_sshd, job)]
    assert events.count("sample") == 8 and events[-1] == "end"
    state = json.loads((workdir(eval_sshd) / "jobs" / job / "exit.json").read_text())
    assert state["state"] == "done"

    jobs = json.loads(dflash("jobs", "-i", str(inventory), "--json").stdout)
    assert {"host": "evalhost", "job_id": job, "state": "done"}.items() <= next(
        j for j in jobs if j["job_id"] == job
    ).items()


def _long_ground_truth(path: Path, n: int = 60, length: int = 300) -> None:
    """A valid ground-truth file whose eval takes a while (ids within the tiny vocab)."""
    import random

    rng = random.Random(0)
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {
                        "id": f"long-{i}",
                        "prompt_ids": [rng.randrange(8, 300) for _ in range(16)],
                        "completion_ids": [rng.randrange(8, 300) for _ in range(length)],
                    }
                )
                + "\n"
            )


def test_cancel_stops_every_process_of_the_job(inventory, eval_sshd, tmp_path):
    gt = eval_sshd.root / "long-ground-truth.jsonl"
    _long_ground_truth(gt)
    started = dflash(
        "remote-eval",
        "--checkpoint",
        "step-12",
        "--ground-truth-kind",
        "file",
        "--ground-truth",
        str(gt),
        "--budgets",
        "8,16,32",
        "--detach",
        "--json",
        "-i",
        str(inventory),
    )
    assert started.returncode == 0, started.stderr
    ref = json.loads(started.stdout)
    job, pgid = ref["job_id"], ref["pgid"]
    _wait_for(
        lambda: any(e["event"] == "sample" for e in _events(eval_sshd, job)),
        "the first evaluated sample",
    )
    supervisor = psutil.Process(ref["pid"])
    family = [supervisor, *supervisor.children(recursive=True)]
    # the supervisor and the runner it forked, which runs the engine itself: one torch
    # import a job, in the runner only
    assert len(family) == 2
    assert not any("libtorch" in m.path for m in supervisor.memory_maps())
    assert all(p.pid == pgid or os.getpgid(p.pid) == pgid for p in family)

    cancelled = dflash("jobs", "cancel", job, "-i", str(inventory), "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    out = json.loads(cancelled.stdout)
    assert out["state"] == "cancelled" and out["was"] == "running"

    def gone(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert all(gone(p) for p in family)
    alive = [p for p in psutil.process_iter(["pid"]) if not gone(p) and _pgid(p.pid) == pgid]
    assert alive == []
    jobs = json.loads(
        dflash("jobs", "list", "--host", "evalhost", "-i", str(inventory), "--json").stdout
    )
    assert next(j for j in jobs if j["job_id"] == job)["state"] == "cancelled"
    # Attaching to a cancelled job says so in one line.
    again = dflash("jobs", "attach", job, "-i", str(inventory))
    assert again.returncode != 0
    assert f"job {job} on evalhost cancelled" in one_error_line(again)


def test_a_full_disk_during_an_eval_is_reported_with_the_os_error(
    eval_sshd, ssh_base, make_inventory, eval_models, gt_server, tmp_path
):
    """The eval host's disk fills while the job writes (a real tmpfs, filled to its last
    byte after the first sample): the job ends `failed` with exit.json saying the host's
    OS error and the file, and attach says that in one line. Before: the runner died
    writing its events, no exit.json, state `lost`, no cause."""
    from tests.helpers.diskfull import fill, tiny_filesystem

    gt = eval_sshd.root / "long-ground-truth-diskfull.jsonl"
    _long_ground_truth(gt)
    with tiny_filesystem(eval_sshd.root / f"tiny-{os.getpid()}", "48m") as disk:
        inv = eval_inventory(
            make_inventory,
            eval_sshd,
            ssh_base,
            eval_models,
            gt_server,
            tmp_path / "r",
            workdir=str(disk),
        )
        started = dflash(
            "remote-eval",
            "--checkpoint",
            "step-12",
            "--ground-truth-kind",
            "file",
            "--ground-truth",
            str(gt),
            "--budgets",
            "8",
            "--detach",
            "--json",
            "-i",
            str(inv),
        )
        assert started.returncode == 0, started.stderr
        ref = json.loads(started.stdout)
        job, folder = ref["job_id"], disk / "jobs" / ref["job_id"]

        def events() -> str:
            return (folder / "events.jsonl").read_text()

        _wait_for(lambda: '"event": "sample"' in events(), "the first evaluated sample")
        fill(disk)
        runner = psutil.Process(ref["pid"])
        _wait_for(lambda: not runner.is_running() or runner.status() == "zombie", "the end")
        ended = json.loads((folder / "exit.json").read_text())
        assert ended["state"] == "failed", ended
        assert ended["error"].startswith("no space left on device (ENOSPC) while writing ")
        assert str(folder) in ended["error"]
        assert all(line.startswith("{") for line in events().splitlines())  # whole lines
        attached = dflash("jobs", "attach", job, "-i", str(inv))
        assert attached.returncode != 0
        line = one_error_line(attached)
        assert f"job {job} on evalhost failed: no space left on device (ENOSPC)" in line


def test_a_full_disk_at_a_job_start_is_one_line_and_starts_nothing(tmp_path):
    """Before: an OSError traceback from writing spec.json, and half a job folder."""
    from remote.errors import UserError
    from remote.jobs import start as jobs
    from tests.helpers.diskfull import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "tiny", "1m") as disk:
        (disk / "jobs").mkdir()
        fill(disk)
        with pytest.raises(
            UserError,
            match=r"cannot start the job: no space left on device \(ENOSPC\) while writing ",
        ):
            jobs.start(str(disk), "j1", {"kind": "eval", "checkpoint": "x"})
        assert list((disk / "jobs").iterdir()) == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_preflight_failures_are_one_line_and_start_nothing(
    inventory, eval_sshd, tmp_path, tiny_target
):
    before = job_dirs(eval_sshd)
    missing = dflash("remote-eval", "--checkpoint", "step-999", "-i", str(inventory))
    assert missing.returncode != 0
    assert "drafter checkpoint folder" in one_error_line(missing)
    assert "step-999 does not exist" in one_error_line(missing)

    down = dflash(
        "remote-eval",
        "--checkpoint",
        "step-0",
        "--ground-truth",
        "http://127.0.0.1:9",
        "-i",
        str(inventory),
    )
    assert down.returncode != 0
    assert "refused the connection" in one_error_line(down)

    greedy = dflash("remote-eval", "--checkpoint", "step-0", "--top-k", "5", "-i", str(inventory))
    assert greedy.returncode != 0 and "sampled ground truth only" in one_error_line(greedy)

    # A target whose weights need far more RAM than any host has: its config (what the
    # engine builds, on the meta device) and a safetensors header exist, which is all
    # preflight reads.
    huge = eval_sshd.root / "huge-target"
    huge.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # a target with a tokenizer
        shutil.copy(tiny_target / name, huge / name)
    cfg = json.loads((tiny_target / "config.json").read_text())
    cfg.update(vocab_size=4_000_000, hidden_size=100_000)
    (huge / "config.json").write_text(json.dumps(cfg))
    header = json.dumps(
        {
            "model.embed_tokens.weight": {
                "dtype": "BF16",
                "shape": [4_000_000, 100_000],
                "data_offsets": [0, 8 * 10**11],
            }
        }
    ).encode()
    (huge / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    ram = dflash(
        "remote-eval", "--checkpoint", "step-0", "--target", str(huge), "-i", str(inventory)
    )
    assert ram.returncode != 0
    line = one_error_line(ram)
    assert "not enough free RAM" in line and "GiB is available" in line

    assert job_dirs(eval_sshd) == before


def test_a_checkpoint_not_relayed_yet_says_the_relay_to_run(
    trainer_sshd, eval_sshd, ssh_base, make_inventory, eval_models, gt_server, tmp_path
):
    """Issue 48.9: a checkpoint not on the eval host yet was 'drafter checkpoint folder ...
    does not exist on this host', after an empty line. Now it is one line ending with the
    relay to run, and that relay, run as written, puts it there."""
    ckpts = trainer_sshd.root / f"unrelayed-{tmp_path.name}"
    shutil.copytree(eval_models["drafters"] / "step-12", ckpts / "step-77")
    drafters = eval_sshd.root / f"unrelayed-{tmp_path.name}-drafters"
    drafters.mkdir()
    inv = make_inventory(
        hosts={
            "trainer": ssh_host_entry(
                trainer_sshd, ssh_base, roles={"trainer": {"checkpoints": str(ckpts)}}
            ),
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                roles={
                    "eval": {
                        "drafters": str(drafters),
                        "target_model": str(eval_models["target"]),
                        "ground_truth": gt_server.url,
                    }
                },
            ),
        },
        defaults={"relay_from": "trainer", "eval_host": "evalhost"},
    )
    proc = dflash("remote-eval", "--checkpoint", "step-77", "-i", str(inv))
    assert proc.returncode != 0
    [line] = proc.stderr.splitlines()  # one line, no empty one before it
    assert line.startswith("error: evalhost: drafter checkpoint folder ") and line.endswith(
        "does not exist on this host; relay it here first: dflash relay step-77 --to evalhost"
    ), line
    relay = dflash(*shlex.split(line.split("first: dflash ")[1]), "-i", str(inv))
    assert relay.returncode == 0, relay.stderr
    assert (drafters / "step-77" / "config.json").is_file()


def test_jobs_attach_and_cancel_take_a_part_of_the_id(inventory, eval_sshd):
    """Issue 48.15: `jobs attach` and `jobs cancel` took whole ids only, where `results`
    commands take a unique prefix. Now one resolver serves both: a part naming one job is
    that job; one naming several is one line listing them; none is one line."""
    small = ("--samples", "1", "--max-new-tokens", "8", "--detach", "--json", "-i")
    ids = []
    for step in ("step-0", "step-12"):
        proc = dflash("remote-eval", "--checkpoint", step, *small, str(inventory))
        assert proc.returncode == 0, proc.stderr
        ids.append(json.loads(proc.stdout)["job_id"])
    common = os.path.commonprefix(ids)
    both = [j for j in job_dirs(eval_sshd) if j.startswith(common)]
    assert len(both) >= 2 and set(ids) <= set(both)
    ambiguous = dflash("jobs", "cancel", common, "-i", str(inventory))
    assert ambiguous.returncode != 0
    [line] = ambiguous.stderr.splitlines()
    assert f"{common!r} matches {len(both)} jobs on evalhost: {', '.join(sorted(both))}" in line
    attached = dflash("jobs", "attach", ids[1][:-1], "-i", str(inventory), "--json")
    assert attached.returncode == 0, attached.stderr
    assert json.loads(attached.stdout)["run_id"] == ids[1]
    cancelled = dflash("jobs", "cancel", ids[0][:-2], "-i", str(inventory), "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["job_id"] == ids[0]
    for command in ("attach", "cancel"):  # one line, no empty one before it
        none = dflash("jobs", command, "nope", "-i", str(inventory))
        assert none.returncode != 0
        assert none.stderr.splitlines() == [
            "error: no job 'nope' on evalhost (dflash jobs list --host evalhost shows them)"
        ]


def test_a_target_without_tokenizer_is_refused_before_anything_loads(
    inventory, eval_sshd, tiny_target, server
):
    """transformers 5 builds an empty tokenizer from config.json alone, every prompt became
    [] and the job died inside generate (IndexError). The host's checks refuse such a
    target in one line, on every path that tokenises text prompts: one host, shards, and
    local ground truth; nothing is asked of the server and no job is left."""
    notok = without_tokenizer(tiny_target, eval_sshd.root / "target-no-tokenizer")
    before = job_dirs(eval_sshd)
    asked = len(server.requests)
    for how in (["--host", "evalhost"], ["--hosts", "evalhost"], ["--ground-truth-kind", "local"]):
        proc = dflash(
            "remote-eval", "--checkpoint", "step-0", "--target", str(notok), *how,
            "-i", str(inventory),
        )  # fmt: skip
        assert proc.returncode != 0, how
        line = one_error_line(proc)
        assert f"target folder {notok} has no tokenizer" in line, (how, line)
        assert "add the target's tokenizer files" in line and "--ground-truth-kind file" in line
    assert job_dirs(eval_sshd) == before and len(server.requests) == asked
    # Token ids need no tokenizer: the same target with ids as ground truth passes the checks.
    from remote.eval.preflight import check_target

    spec = {"eval": {"target": str(notok)}, "ground_truth": {"kind": "file", "path": "/x"}}
    assert check_target(spec)[2] == notok


def test_wrong_python_on_the_host_is_one_line(eval_sshd, ssh_base, make_inventory, eval_models):
    inv = make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                python="/nonexistent/bin/python3",
                roles={
                    "eval": {
                        "drafters": str(eval_models["drafters"]),
                        "target_model": str(eval_models["target"]),
                        "ground_truth_kind": "local",
                    }
                },
            )
        },
        defaults={"eval_host": "evalhost"},
    )
    proc = dflash("remote-eval", "--checkpoint", "step-0", "-i", str(inv))
    assert proc.returncode != 0
    line = one_error_line(proc)
    assert "/nonexistent/bin/python3" in line and "not found" in line


def test_a_host_answer_without_end_is_refused_at_the_limit():
    """The first line a job command answers is read before anything else; a host that sends
    bytes without ever ending that line is refused at the limit with one line naming it,
    not buffered without end."""
    from orchestrator.inventory import HostSpec
    from orchestrator.transport.hosts import HostError, open_host
    from orchestrator.transport.lines import HostLines

    with open_host(HostSpec(name="chatty", transport="local")) as host:
        proc = host.popen("head -c 1000000 /dev/zero | tr '\\0' x")
        lines = HostLines(host.name, proc, "job start", limit=64 << 10)
        with pytest.raises(HostError, match=r"chatty: job start sent a line over 64 KiB; refused"):
            lines.line()
        proc = host.popen("""printf '{"ok": 1}\\nlater'""")
        lines = HostLines(host.name, proc, "job start", limit=64 << 10)
        assert lines.line() == b'{"ok": 1}\n'
        assert lines.line() == b"later"  # what follows the line stays for the watcher
        lines.wait()


def test_remote_eval_on_spec_bench_gives_tau_per_category_in_every_view(
    inventory, server, tmp_path
):
    """`--prompts spec-bench --samples 6`: one prompt per Spec-Bench category (seeded),
    each sample record labelled, tau per category in the JSON, the tables, the CSV and the
    report, and a paired delta with its interval per category from `results compare`."""
    categories = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    outs = []
    for checkpoint in ("step-0", "step-12"):
        proc = dflash(
            "remote-eval",
            "--checkpoint",
            checkpoint,
            "--prompts",
            "spec-bench",
            "--samples",
            "6",
            "--max-new-tokens",
            "8",
            "--budgets",
            "4",
            "-i",
            str(inventory),
            "--json",
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout))
    out = outs[1]
    groups = out["breakdown"]["category"]
    assert {g["name"] for g in groups} == categories and all(g["samples"] == 1 for g in groups)
    run_dir = Path(out["run_dir"])
    recs = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {r["category"] for r in recs} == categories
    assert [r["subcategory"] for r in recs if r["category"] == "mt_bench"][0]
    by_cat = {r["category"]: r["tau"] for r in recs}
    got = {g["name"]: g["tau_per_sample_mean"] for g in groups}
    assert got == by_cat  # one sample each: its own tau
    gt = json.loads((run_dir / "ground_truth.json").read_text())
    assert gt["thinking"] is False and len(gt["chat_template_sha256"]) == 64
    assert out["summary"]["thinking"] == "off"

    run_id = out["run_id"]
    shown = dflash("results", "show", run_id, "-i", str(inventory))
    assert "tau by category" in shown.stdout
    assert [g["samples"] for g in out["breakdown"]["subcategory"]] == [1]  # JSON has it all
    assert all(c in shown.stdout for c in categories)
    exported = dflash("results", "export", run_id, "-f", "csv", "-i", str(inventory))
    row = next(csv.DictReader(io.StringIO(exported.stdout)))
    tau = float(row["tau_per_sample_mean_category_translation"])
    assert tau == pytest.approx(by_cat["translation"])
    page = tmp_path / "report.html"
    made = dflash("results", "report", run_id, "-o", str(page), "-i", str(inventory))
    assert made.returncode == 0, made.stderr
    assert "<h3>tau by category</h3>" in page.read_text()
    assert (run_dir / "tau_by_category.png").is_file()
    # One round's costs, measured on the host after the walk, give the speedup estimate.
    result = json.loads((run_dir / "result.json").read_text())
    costs = result["timings"]["round_costs"]
    block = result["inputs"]["block_size"]
    assert set(costs["target_verify_s"]) == {str(block), "5"}, costs  # the chain, DDTree-4
    assert set(costs["tree_verify_s"]) == {"4"}, costs  # DDTree-4's tree, its tree mask
    assert costs["target_step_s"] > 0 and costs["drafter_round_s"] > 0
    from orchestrator.results import speedup, store

    # a busy host (this suite's other processes) may withhold it, in one line, by design
    withheld = speedup.withheld(store.load_run(run_dir))
    estimate = out["summary"]["speedup_estimate"]
    assert (estimate is None) if withheld else (estimate > 0), (estimate, withheld)
    compared = dflash(
        "results", "compare", outs[0]["run_id"], run_id, "-i", str(inventory), "--json"
    )
    assert compared.returncode == 0, compared.stderr
    paired = json.loads(compared.stdout)["paired"][0]
    assert paired["comparable"] is True, paired["problems"]
    per_cat = [g for g in paired["groups"] if g["axis"] == "category"]
    assert {g["name"] for g in per_cat} == categories
    for g in per_cat:
        tau = next(d for d in g["deltas"] if d["label"] == "tau")
        assert tau["low"] <= tau["delta"] <= tau["high"]


def test_a_prompts_upload_killed_midway_is_never_used_and_the_next_run_succeeds(
    inventory, eval_sshd, tmp_path
):
    """The fault run's case: `--prompts big.jsonl` killed while its bytes were on the way
    left them under the content-addressed name, and the next run read the cut copy."""
    big = tmp_path / "mid.jsonl"
    pad = "x" * 4000
    big.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": f"Say {i}. {pad}"}) + "\n" for i in range(10000)
        )
    )
    prompts = workdir(eval_sshd) / "prompts"
    final = prompts / f"{hashlib.sha256(big.read_bytes()).hexdigest()[:16]}-mid.jsonl"
    argv = ["remote-eval", "--checkpoint", "step-12", "--prompts", str(big), "--samples", "2"]
    argv += ["--max-new-tokens", "8", "--budgets", "4", "-i", str(inventory)]
    cli = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for(
        lambda: any(p.stat().st_size > (1 << 20) for p in prompts.glob("*.partial-*")),
        "a part of the prompts on the host",
    )
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    _wait_for(lambda: not list(prompts.glob("*.partial-*")), "the cut copy removed", 30)
    assert not final.exists()

    again = dflash(*argv, "--json", timeout=300)
    assert again.returncode == 0, again.stderr
    assert final.read_bytes() == big.read_bytes()
    result = json.loads((Path(json.loads(again.stdout)["run_dir"]) / "result.json").read_text())
    assert result["metrics"]["samples"] == 2
