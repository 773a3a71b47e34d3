"""CI's check of commit subjects (`.ci/check_subjects.py`, run by `.ci/run`): a subject over
72 characters among the commits after the one that added the check fails it in one line
naming the commit; the subjects before it are grandfathered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / ".ci" / "check_subjects.py"
LONG = "Relay: a subject that says far too much about what changed, past seventy-two"


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _commit(repo: Path, subject: str) -> str:
    _git(repo, "commit", "-q", "--allow-empty", "-m", subject, "-m", "the body may be long")
    return _git(repo, "rev-parse", "HEAD")


def _check(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK)], cwd=repo, capture_output=True, text=True)


def _repo(tmp_path: Path) -> Path:
    """A repository whose first commit has a long subject, then one that adds the check."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, LONG + " (grandfathered: before the check)")
    (repo / ".ci" / "check_subjects.py").write_bytes(CHECK.read_bytes())
    _git(repo, "add", ".ci")
    _commit(repo, "CI: check commit subjects")
    return repo


def test_a_long_subject_after_the_check_fails_ci_in_one_line(tmp_path):
    repo = _repo(tmp_path)
    assert len(LONG) > 72
    ok = _check(repo)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    long = _commit(repo, LONG)
    _commit(repo, "A later short subject")
    bad = _check(repo)
    assert bad.returncode == 1
    (line,) = bad.stderr.splitlines()
    assert line.startswith(f"ci: commit {long[:7]}") and f"{len(LONG)} characters, over 72" in line
    assert repr(LONG) in line


def test_a_shallow_clone_is_one_line_not_a_pass(tmp_path):
    repo = _repo(tmp_path)
    _commit(repo, LONG)
    _commit(repo, "Short")
    _git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", "shallow")
    bad = _check(tmp_path / "shallow")
    (line,) = bad.stderr.splitlines()
    assert bad.returncode == 1 and "a shallow clone" in line


def test_ci_runs_the_check():
    assert "python3 .ci/check_subjects.py" in (ROOT / ".ci" / "run").read_text()
