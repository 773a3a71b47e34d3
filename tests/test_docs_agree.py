"""The docs say what the tool does: where a sentence of docs/ states a default or an exit
status, the tool is run (or its constant read) and the sentence checked against it."""

from __future__ import annotations

import json
import re
import time

from orchestrator.commands.common import EXIT_INTERRUPTED, EXIT_TERMINATED
from tests.helpers.cli import ROOT, dflash

DOCS = ROOT / "docs"


def _prose(name: str) -> str:
    """A docs page with its line breaks as spaces, so a sentence is found whole."""
    return " ".join((DOCS / name).read_text().split())


def test_follow_md_gives_the_exit_statuses_a_stop_has():
    """Issue 48.16: docs/follow.md said SIGTERM exits 130; it exits 143 (test_follow.py
    sends it for real). The page, follow's help and the code give the same two."""
    text = _prose("follow.md")
    said = re.search(r"status (\d+) after Ctrl-C, (\d+) after SIGTERM", text)
    assert said, "docs/follow.md no longer says how a stopped follow exits"
    assert (int(said[1]), int(said[2])) == (EXIT_INTERRUPTED, EXIT_TERMINATED)
    help_text = " ".join(dflash("follow", "-h").stdout.split())
    assert f"Ctrl-C (exit {EXIT_INTERRUPTED}) or SIGTERM (exit {EXIT_TERMINATED})" in help_text


def _job(workdir, job_id: str) -> None:
    """A finished job's folder, as the host's runner leaves it (its spec and exit record)."""
    folder = workdir / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"kind": "eval", "created": time.time()}))
    (folder / "exit.json").write_text(json.dumps({"state": "done", "code": 0}))


def test_commands_md_gives_the_hosts_jobs_commands_ask(tmp_path, make_inventory):
    """Issue 48.16: docs/commands.md said `jobs --host` defaults to the eval host; `jobs
    list` asks every host, `jobs attach` and `jobs cancel` the eval host."""
    text = _prose("commands.md")
    assert (
        "`jobs list --host` defaults to every host in the inventory, `jobs attach` and "
        "`jobs cancel --host` to `defaults.eval_host`"
    ) in text
    hosts = {}
    for name in ("trainer", "evalbox"):
        hosts[name] = {"transport": "local", "workdir": str(tmp_path / name)}
        _job(tmp_path / name, f"20260101-000000-{name}-0000")
    hosts["evalbox"]["roles"] = {"eval": {"drafters": str(tmp_path / "d")}}
    inv = make_inventory(hosts=hosts, defaults={"eval_host": "evalbox"})
    listed = dflash("jobs", "list", "-i", str(inv), "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["host"] for r in json.loads(listed.stdout)) == ["evalbox", "trainer"]
    for command in ("attach", "cancel"):
        proc = dflash("jobs", command, "trainer-0000", "-i", str(inv))
        assert proc.returncode != 0 and "no job 'trainer-0000' on evalbox" in proc.stderr
