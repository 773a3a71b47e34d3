"""A relay's fixed cost: how many commands it runs on each host, over real loopback sshd.

Each host's ``python`` is a wrapper that logs the bundle command it is asked to run and
then runs the real interpreter, so the counts are what the hosts really started. An
unchanged relay runs ONE command per host (the source's ``relay-send``, whose ready frame
carries the scan; the destination's ``relay-lock``, which also receives the first batch),
and a changed file is still sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from orchestrator.inventory import load_inventory
from orchestrator.relay.run import RelayOptions, list_checkpoints
from remote.protocol import FRAME_HEADER
from tests.helpers.checkpoints import make_checkpoint, tree
from tests.helpers.cli import ROOT, dflash

MiB = 1 << 20

LOGGER = """#!/bin/sh
for a in "$@"; do case "$a" in relay-*) echo "$a" >> {log};; esac; done
exec {real} "$@"
"""


def _logging_pythons(tenv) -> tuple:
    """Make both hosts' python log their relay commands; (trainer log, eval host log).
    A dry run first puts the current bundle on both hosts (a host without it gets it
    pushed, and the command that found it missing is run again: installation, not the
    relay's own cost)."""
    list_checkpoints(
        load_inventory(tenv.inventory_path), "trainer", ["evalhost"], RelayOptions(dry_run=True)
    )
    logs = []
    for side in ("trainer", "eval"):
        log = tenv.tmp / f"{side}-commands.log"
        script = tenv.tmp / f"{side}-python"
        script.write_text(LOGGER.format(log=log, real=sys.executable))
        script.chmod(0o755)
        setattr(tenv, f"{side}_py", str(script))
        logs.append(log)
    return tuple(logs)


def _commands(log) -> list[str]:
    lines = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return lines


def test_an_unchanged_relay_runs_one_command_per_host_and_a_changed_file_is_sent(tenv):
    trainer_log, eval_log = _logging_pythons(tenv)
    files = make_checkpoint(
        tenv.ckpt, "step_10", {f"model-{i}.safetensors": MiB + i for i in range(4)}
    )
    report = tenv.relay(jobs=1)
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_10") == files
    # Fresh: the source's relay-send started ahead streams; the lock holder receives.
    assert _commands(trainer_log) == ["relay-send"]
    assert _commands(eval_log) == ["relay-lock"]
    assert not (tenv.dst / ".dflash-relay.lock").exists()  # the lock ended with the relay

    proc = tenv.cli()  # unchanged, through the real CLI
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["bytes_read"] == 0
    assert summary["checkpoints"][0]["destinations"]["evalhost"]["status"] == "unchanged"
    assert _commands(trainer_log) == ["relay-send"]
    assert _commands(eval_log) == ["relay-lock"]

    # One file rewritten (same size, a new mtime): not unchanged, and its bytes arrive.
    changed = tenv.ckpt / "step_10" / "model-2.safetensors"
    new = os.urandom(len(files["model-2.safetensors"]))
    changed.write_bytes(new)
    st = changed.stat()
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    proc = tenv.cli()
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["checkpoints"][0]["destinations"]["evalhost"]["status"] != "unchanged"
    assert summary["bytes_read"] >= len(new)
    assert (tenv.dst / "step_10" / "model-2.safetensors").read_bytes() == new
    manifest = json.loads((tenv.dst / "step_10" / ".dflash-manifest.json").read_text())
    sums = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert sums["model-2.safetensors"] == hashlib.sha256(new).hexdigest()
    assert _commands(eval_log) == ["relay-lock"]  # the changed batch went to the lock holder
    tenv.outside_intact()


def test_each_checkpoint_reuses_the_lock_holder_and_other_batches_get_a_receiver(tenv):
    _, eval_log = _logging_pythons(tenv)
    sizes = {f"part-{i}.bin": MiB + 7 * i for i in range(4)}
    first = make_checkpoint(tenv.ckpt, "step_11", sizes)
    second = make_checkpoint(tenv.ckpt, "step_12", sizes)
    report = tenv.relay(jobs=2, all=True)
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_11") == first and tree(tenv.dst / "step_12") == second
    # two batches per checkpoint: the lock holder takes one of each, a relay-recv the other
    assert sorted(_commands(eval_log)) == ["relay-lock", "relay-recv", "relay-recv"]


def test_a_batch_that_fails_in_the_lock_holder_fails_that_destination_and_frees_the_lock(tenv):
    files = make_checkpoint(tenv.ckpt, "step_13", {"a.bin": MiB, "b.bin": 3})
    blocker = tenv.dst / ".partial-step_13" / "a.bin"
    blocker.mkdir(parents=True)  # a folder where the file must go: the write fails there
    report = tenv.relay(jobs=1)
    assert not report.ok
    status = report.checkpoints[0].destinations["evalhost"]
    assert status.status == "failed"
    assert "is a directory" in status.error and "a.bin" in status.error
    assert not (tenv.dst / "step_13").exists()  # nothing half-published
    assert not (tenv.dst / ".dflash-relay.lock").exists()  # the holder ended: lock dropped

    blocker.rmdir()
    report = tenv.relay(jobs=1)  # the lock is free again, and the file goes through
    assert report.ok, report.failures
    assert tree(tenv.dst / "step_13") == files
    tenv.outside_intact()


def test_a_json_relay_never_imports_rich(tenv):
    """--json prints no markup: the consoles, the progress views and the report's table
    renderer (rich, about 30 ms of a start) stay unimported; a human run still uses them."""
    make_checkpoint(tenv.ckpt, "step_14", {"model.safetensors": MiB})
    assert tenv.relay().ok
    code = (
        "import sys\nsys.modules['rich'] = None\n"  # any rich import fails
        "sys.argv = ['dflash', 'relay', '--json', '--inventory', sys.argv[1]]\n"
        "from orchestrator.cli import main\nmain()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tenv.inventory_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["checkpoints"][0]["destinations"]["evalhost"]["status"] == "unchanged"
    human = dflash("relay", "--inventory", str(tenv.inventory_path))
    assert human.returncode == 0, human.stderr
    assert "unchanged" in human.stdout and "step_14" in human.stdout


def _frame(data: bytes) -> bytes:
    return FRAME_HEADER.pack(len(data)) + data


def test_the_lock_holder_receives_a_batch_in_step_and_refuses_one_outside(tmp_path):
    """``relay-lock``'s ``recv`` on the host itself: a batch arrives byte-exact and the
    channel goes on answering; a batch naming a path outside the partial folders is
    refused with one line, and the holder ends (and its lock with it)."""
    root = tmp_path / "drafters"
    proc = subprocess.Popen(
        [sys.executable, "-m", "remote", "relay-lock", "--by=test", "--", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    def say(data: bytes) -> dict:
        proc.stdin.write(data)
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        assert json.loads(proc.stdout.readline())["locked"] is True
        assert say(b'{"op": "recv"}\n') == {"ready": True}
        data = os.urandom(300_000)
        request = [{"path": ".partial-step_1/a.bin", "offset": 0}]
        line = say(_frame(json.dumps(request).encode()) + _frame(data))
        assert line["i"] == 0 and line["sha256"] == hashlib.sha256(data).hexdigest()
        assert json.loads(proc.stdout.readline()) == {"done": True}
        assert (root / ".partial-step_1" / "a.bin").read_bytes() == data
        assert "a.bin" in json.dumps(say(b'{"op": "scan"}\n'))  # still in step

        assert say(b'{"op": "recv"}\n') == {"ready": True}
        bad = [{"path": "../outside.bin", "offset": 0}]
        done = say(_frame(json.dumps(bad).encode()) + _frame(b"x"))
        assert done["done"] is True and "refusing to write" in done["error"]
        assert proc.wait(timeout=30) == 0  # the holder ended
    finally:
        proc.kill()
    assert not (tmp_path / "outside.bin").exists()
    assert not (root / ".dflash-relay.lock").exists()  # its lock ended with it


def test_line_reader_splits_across_reads_and_refuses_an_endless_line():
    """What a host sends on the holder's channel is read line by line whatever the chunking,
    and a host that never ends its line is refused at the limit, not buffered without end."""
    from orchestrator.transport.lines import LineReader

    chunks = [b'{"a": 1}\n{"b"', b": 2}\n", b"\n", b"tail"]
    reader = LineReader(lambda n: chunks.pop(0) if chunks else b"")
    assert [reader.line() for _ in range(5)] == [b'{"a": 1}\n', b'{"b": 2}\n', b"\n", b"tail", b""]

    sent = []

    def endless(n: int) -> bytes:
        sent.append(n)
        return b"x" * n

    with pytest.raises(OSError, match="over 1 MiB"):
        LineReader(endless, limit=1 << 20).line()
    assert sum(sent) <= (1 << 20) + 65536  # stopped at the limit, one read past it at most
