#!/usr/bin/env python3
"""CI's check of commit subjects (CONTRIBUTING.md: at most 72 characters) on every commit
after the one that added this script, in the repository of the current folder: one line
per subject that is too long, exit 1. The commits before it are grandfathered, and a
commit landing later is checked however old it is. Stdlib only: CI runs it with the
system's python3 before any venv exists."""

from __future__ import annotations

import subprocess
import sys

LIMIT = 72
SELF = ".ci/check_subjects.py"


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, encoding="utf-8")


def fail(line: str) -> int:
    print(f"ci: {line}", file=sys.stderr)
    return 1


def main() -> int:
    shallow = git("rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        why = (shallow.stderr.strip().splitlines() or ["git failed"])[0]
        return fail(f"commit subjects: not in a git checkout (CI runs on a clone of main): {why}")
    if shallow.stdout.strip() == "true":
        return fail(
            "commit subjects: a shallow clone; fetch the whole history (git fetch --unshallow)"
        )
    added = git("log", "--diff-filter=A", "--format=%H", "--", f":/{SELF}")
    base = added.stdout.split()[-1:] if added.returncode == 0 else []
    if not base:
        return fail(f"commit subjects: no commit of this clone adds {SELF}; commit it first")
    log = git("log", "--no-color", "--format=%h%x09%s", f"{base[0]}..HEAD")
    if log.returncode != 0:
        return fail(f"commit subjects: git log failed: {log.stderr.strip()}")
    code = 0
    for entry in log.stdout.splitlines():
        sha, _, subject = entry.partition("\t")
        if len(subject) > LIMIT:
            code = fail(
                f"commit {sha}'s subject is {len(subject)} characters, over {LIMIT}: "
                f"{subject!r}; reword it (git rebase -i {sha}^) and put the rest in the body"
            )
    return code


if __name__ == "__main__":
    sys.exit(main())
