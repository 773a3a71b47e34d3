"""`dflash jobs prune` over a real loopback sshd host: what it removes from the host's
workdir (finished job folders, cache entries, by age), what it never touches (a running
job, the caches while a job runs, anything a symlink points at), with the workdir's path
quoted however it is spelled."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from remote.jobs.folder import proc_starttime
from tests.helpers.cli import dflash
from tests.helpers.sshd import ssh_host_entry

DAY = 86400


def _job(jobs: Path, name: str, state: str | None, *, pid: int | None = None, days: float = 0):
    """A job folder as the host's runner leaves it: its spec, its runner's pid record (a
    live process: running; a gone one without exit record: lost) and its exit record
    (`state`); every file `days` old."""
    folder = jobs / name
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"kind": "eval", "created": time.time()}))
    (folder / "events.jsonl").write_bytes(b"{}\n" * 1000)
    if pid is not None:
        record = {"pid": pid, "pgid": pid, "starttime": proc_starttime(pid) or 1}
        (folder / "pid.json").write_text(json.dumps(record))
    if state is not None:
        (folder / "exit.json").write_text(json.dumps({"state": state, "code": 0}))
    _age(folder, days)


def _age(path: Path, days: float) -> None:
    when = time.time() - days * DAY
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (when, when), follow_symlinks=False)


def _size(path: Path) -> int:
    files = [path, *path.rglob("*")] if path.is_dir() else [path]
    return sum(p.lstat().st_size for p in files if not p.is_dir() or p.is_symlink())


@pytest.fixture
def host(eval_sshd, ssh_base, make_inventory, tmp_path):
    """A workdir (its path with a space, quotes and a `$(...)`) holding an old finished
    job with a link out of the workdir, a recent one, an old lost one, a running one (a
    live process), a link in place of a job folder, and cache entries old and new."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    wd = eval_sshd.root / f"work dir '$(touch {tmp_path}/pwned)'"
    jobs = wd / "jobs"
    sleeper = subprocess.Popen(["sleep", "600"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    _job(jobs, "old-done", "done", days=10)
    (jobs / "old-done" / "out").symlink_to(outside)
    _age(jobs / "old-done", 10)
    _job(jobs, "new-done", "failed")
    _job(jobs, "old-lost", None, pid=gone.pid, days=10)
    _job(jobs, "running", None, pid=sleeper.pid, days=10)
    (jobs / "evil").symlink_to(outside)
    for area, name, days in (
        ("features", "old.safetensors", 10),
        ("features", "new.safetensors", 0),
        ("groundtruth", "old.jsonl", 10),
    ):
        (wd / area).mkdir(exist_ok=True)
        (wd / area / name).write_bytes(b"x" * 4096)
        _age(wd / area / name, days)
    (wd / "features" / ".lock").write_bytes(b"")
    inv = make_inventory(hosts={"evalhost": ssh_host_entry(eval_sshd, ssh_base, workdir=str(wd))})
    yield {"inv": str(inv), "wd": wd, "outside": outside, "sleeper": sleeper, "tmp": tmp_path}
    sleeper.kill()
    sleeper.wait()


def _prune(h, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    proc = dflash("jobs", "prune", "-i", h["inv"], "--json", *args)
    assert proc.returncode == 0, proc.stderr
    [answer] = json.loads(proc.stdout)
    return answer, proc


def _tree(wd: Path) -> set[str]:
    """What the workdir holds, the bundle dflash pushes there aside."""
    return {str(p) for p in wd.rglob("*") if "bundles" not in p.relative_to(wd).parts}


def _names(rows: list[dict], wd: Path) -> set[str]:
    return {str(Path(r["path"]).relative_to(wd)) for r in rows}


def test_prune_removes_what_is_old_and_finished_and_nothing_else(host):
    """Issue 48.18: a host's workdir (jobs, ground truth, a feature cache up to 16 GiB) had
    no prune. --dry-run says what would go with its size and removes nothing; a running
    job is never touched, nor a cache while it runs; a link is never followed."""
    wd = host["wd"]
    before = _tree(wd)
    sizes = {n: _size(wd / "jobs" / n) for n in ("old-done", "old-lost")}
    dry, _ = _prune(host, "--older-than", "1d", "--dry-run", "--features", "--ground-truth")
    assert dry["host"] == "evalhost" and dry["dry_run"] is True and dry["workdir"] == str(wd)
    assert _names(dry["entries"], wd) == {"jobs/old-done", "jobs/old-lost"}
    assert {Path(e["path"]).name: e["bytes"] for e in dry["entries"]} == sizes
    assert {Path(e["path"]).name: e["state"] for e in dry["entries"]} == {
        "old-done": "done",
        "old-lost": "lost",
    }
    kept = {str(Path(s["path"]).relative_to(wd)): s["why"] for s in dry["skipped"]}
    assert kept["jobs/running"] == "job running: never touched"
    assert kept["jobs/evil"] == "not a job folder (a link or a file)"
    assert kept["features"] == kept["groundtruth"] == "a job runs on this host: it may read it"
    assert _tree(wd) == before  # a dry run removes nothing

    table = dflash("jobs", "prune", "-i", host["inv"], "--older-than", "1d", "--dry-run")
    assert table.returncode == 0, table.stderr
    assert "would remove" in table.stdout and "evalhost: would remove 2 item(s)" in table.stdout

    done, _ = _prune(host, "--older-than", "1d")
    assert _names(done["entries"], wd) == {"jobs/old-done", "jobs/old-lost"}
    assert sorted(p.name for p in (wd / "jobs").iterdir()) == ["evil", "new-done", "running"]
    assert (host["outside"] / "precious").read_text() == "keep me"  # links: never followed
    assert not (host["tmp"] / "pwned").exists()  # the workdir's path went quoted

    host["sleeper"].kill()  # the job is over now (lost: a day's grace, its files are older)
    host["sleeper"].wait()
    caches, _ = _prune(host, "--older-than", "1d", "--features", "--ground-truth")
    assert _names(caches["entries"], wd) == {
        "jobs/running",
        "features/old.safetensors",
        "groundtruth/old.jsonl",
    }
    assert sorted(p.name for p in (wd / "features").iterdir()) == [".lock", "new.safetensors"]
    assert list((wd / "groundtruth").iterdir()) == []
    everything, _ = _prune(host, "--older-than", "0", "--features")
    assert _names(everything["entries"], wd) == {"jobs/new-done", "features/new.safetensors"}
    assert (host["outside"] / "precious").read_text() == "keep me"


def test_a_bad_age_is_one_line_before_anything_connects(host):
    proc = dflash("jobs", "prune", "-i", host["inv"], "--older-than", "a week")
    assert proc.returncode != 0
    assert proc.stderr.splitlines() == [
        "error: not an age: 'a week' (use e.g. 7d, 12h, 30m, 90s or 0)"
    ]


def test_a_prune_answer_is_checked_row_by_row():
    """What a host answers to a prune is checked before it is shown: a row of the wrong
    shape is one line naming it."""
    from remote.protocol import AnswerError, check_job_answer

    good = {"path": "/w/jobs/j", "area": "jobs", "bytes": 10, "age": 5.0, "state": "done"}
    answer = {"workdir": "/w", "dry_run": True, "older_than": 0, "skipped": [], "entries": [good]}
    assert check_job_answer("prune", answer) is answer
    with pytest.raises(
        AnswerError, match=r"'entries\[2\]\.bytes' is a number \(-1\), expected a whole"
    ):
        check_job_answer("prune", dict(answer, entries=[good, dict(good, bytes=-1)]))
    with pytest.raises(AnswerError, match=r"'skipped\[1\]\.why' is missing"):
        check_job_answer("prune", dict(answer, skipped=[{"path": "/w/x"}]))
