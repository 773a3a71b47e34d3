"""Bad inputs and faults of ``dflash relay``, table-driven, over real loopback sshd hosts.

Each case sets up the trainer and eval host (files, symlinks, or a host whose ``python``
rewrites its scan answer like a compromised or buggy host would), runs the real CLI and
asserts: the exit code, ONE line on stderr naming the problem, and that nothing was lost
(the trainer's files are unchanged), half-written (nothing published that should not be)
or written outside its folder (a sentinel folder beside the drafters folder, and files
planted where an escaping path would land, stay as they were). Host-side commands are
also run directly with hostile requests (as a compromised controller would send them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from remote.protocol import FRAME_HEADER as HEADER
from tests.helpers.checkpoints import make_checkpoint, published
from tests.helpers.cli import ROOT, one_error_line
from tests.helpers.relay import TEnv

KiB = 1024


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@dataclass
class Case:
    id: str
    setup: Callable[[TEnv], list[str]]  # returns the CLI arguments after `relay --json`
    code: int
    line: str  # regex the one stderr line must match
    publishes: list[str] = field(default_factory=list)  # what may be published


def _ckpt(e: TEnv, name: str = "step_1", marker: bool = True) -> None:
    make_checkpoint(e.ckpt, name, {"w.bin": 64 * KiB, "sub/x.bin": 3 * KiB}, marker=marker)


def _escape_bait(e: TEnv) -> str:
    """A file on the trainer where ``step_1/../../NAME`` resolves: an escaping path in a
    scan answer can be read there and, before the checks, landed on the eval host."""
    name = f"escape-{e.ckpt.name}.bin"
    (e.ckpt.parent / name).write_bytes(b"bait")
    e.escape_name = name
    return name


def trainer_lies(body: str, bait: bool = False):
    def setup(e: TEnv) -> list[str]:
        _ckpt(e)
        name = _escape_bait(e) if bait else "x"
        e.trainer_py = e.wrapper(body.replace("NAME", name))
        return ["step_1"]

    return setup


def eval_lies(body: str):
    def setup(e: TEnv) -> list[str]:
        _ckpt(e)
        victim = e.evalh.root / f"victim-{e.dst.name}.bin"  # where '../../' would land
        victim.write_bytes(b"victim")
        e.victim = victim
        e.eval_py = e.wrapper(body.replace("VICTIM", victim.name))
        return ["step_1"]

    return setup


def plant_partial(make: Callable[[TEnv, Path], None]):
    def setup(e: TEnv) -> list[str]:
        _ckpt(e)
        part = e.dst / ".partial-step_1"
        part.mkdir()
        make(e, part)
        return ["step_1"]

    return setup


def trainer_link(make: Callable[[Path], None]):
    def setup(e: TEnv) -> list[str]:
        _ckpt(e)
        make(e.ckpt / "step_1")
        return ["step_1"]

    return setup


def with_inventory(change: Callable[[TEnv], None], args: list[str] | None = None):
    def setup(e: TEnv) -> list[str]:
        _ckpt(e)
        change(e)
        return args if args is not None else ["step_1"]

    return setup


def _unmanaged(e: TEnv) -> list[str]:
    _ckpt(e)
    (e.dst / "step_1").mkdir()
    (e.dst / "step_1" / "mine.txt").write_text("not relayed by dflash")
    return ["step_1"]


REFUSE_SCAN = r"^error: {host}: refusing its scan of \S+: {what}"

CASES = [
    # -- a trainer whose scan answer lies (compromised or buggy) --------------------------
    Case(
        "trainer-path-dotdot",
        trainer_lies('data["entries"][0]["files"][0]["path"] = "../../NAME"', bait=True),
        2,
        REFUSE_SCAN.format(
            host="trainer",
            what=r"the path '\.\./\.\./escape\S*' in "
            r"step_1 is not a plain relative path",
        ),
    ),
    Case(
        "trainer-path-absolute",
        trainer_lies('data["entries"][0]["files"][0]["path"] = "/etc/passwd"'),
        2,
        REFUSE_SCAN.format(host="trainer", what="the path '/etc/passwd' in step_1 is absolute"),
    ),
    Case(
        "trainer-path-nul",
        trainer_lies('data["entries"][0]["files"][0]["path"] = "w.bin\\x00.x"'),
        2,
        REFUSE_SCAN.format(host="trainer", what=r".* holds a NUL or line break"),
    ),
    Case(
        "trainer-path-newline",
        trainer_lies('data["entries"][0]["files"][0]["path"] = "w.bin\\n../x"'),
        2,
        REFUSE_SCAN.format(host="trainer", what=r".* holds a NUL or line break"),
    ),
    Case(
        "trainer-path-inner-dotdot",
        trainer_lies('data["entries"][0]["files"][0]["path"] = "sub/../../../NAME"', bait=True),
        2,
        REFUSE_SCAN.format(host="trainer", what=r".* is not a plain relative path"),
    ),
    Case(
        "trainer-name-dotdot",
        trainer_lies('data["entries"][0]["name"] = "../step_1"'),
        2,
        REFUSE_SCAN.format(
            host="trainer",
            what=r"the checkpoint name '\.\./step_1' "
            r"is not a plain relative path",
        ),
    ),
    Case(
        "trainer-single-file-path-differs",
        trainer_lies('data["entries"][0]["kind"] = "file"'),
        2,
        REFUSE_SCAN.format(
            host="trainer", what="the entry 'step_1' is neither a folder nor a single file"
        ),
    ),
    Case(
        "trainer-negative-size",
        trainer_lies('data["entries"][0]["files"][0]["size"] = -5'),
        2,
        REFUSE_SCAN.format(
            host="trainer",
            what=r"the size or mtime of step_1/\S+ is not "
            r"a number",
        ),
    ),
    Case(
        "trainer-malformed-answer",
        trainer_lies('data["entries"] = [{"name": "step_1"}]'),
        2,
        REFUSE_SCAN.format(host="trainer", what="the answer is malformed"),
    ),
    # -- an eval host whose scan answer lies -----------------------------------------------
    Case(
        "eval-partial-name-escapes",
        eval_lies('data["partials"]["../../VICTIM"] = []'),
        2,
        REFUSE_SCAN.format(
            host="evalhost",
            what=r"the partial folder '\.\./\.\./victim"
            r"\S*' is not a plain relative path",
        ),
    ),
    Case(
        "eval-partial-file-escapes",
        eval_lies('data["partials"]["step_1"] = [{"path": "../../VICTIM", "size": 3, "mtime": 0}]'),
        2,
        REFUSE_SCAN.format(
            host="evalhost",
            what=r"the path '\.\./\.\./victim\S*' in "
            r"\.partial-step_1 is not a plain relative path",
        ),
    ),
    Case(
        "eval-manifest-name-escapes",
        eval_lies('data["manifests"]["a/../../b"] = {}'),
        2,
        REFUSE_SCAN.format(
            host="evalhost",
            what=r"the checkpoint name 'a/\.\./\.\./b' "
            r"is not a plain relative path",
        ),
    ),
    # -- symlinks planted on the eval host -----------------------------------------------
    Case(
        "eval-link-file-in-partial",
        plant_partial(lambda e, part: (part / "w.bin").symlink_to(e.outside / "sentinel.bin")),
        2,
        r"^error: evalhost: \S+/\.partial-step_1/w\.bin is a symlink; a partial folder "
        r"holds only what the relay wrote",
    ),
    Case(
        "eval-link-dir-in-partial",
        plant_partial(
            lambda e, part: (part / "sub").symlink_to(e.outside, target_is_directory=True)
        ),
        2,
        r"^error: evalhost: \S+/\.partial-step_1/sub points to a folder; a partial "
        r"folder holds only",
    ),
    Case(
        "eval-partial-folder-is-a-link",
        lambda e: (_ckpt(e), (e.dst / ".partial-step_1").symlink_to(e.outside), ["step_1"])[-1],
        1,
        r"^error: relay of step_1 to evalhost failed: step_1/\S+: evalhost: refusing "
        r"to write step_1/\S+ through the symlink \.partial-step_1; rerun",
    ),
    Case(
        "eval-dangling-link-in-partial",
        plant_partial(
            lambda e, part: (part / "w.bin").symlink_to(e.outside / "created-by-relay.bin")
        ),
        2,
        r"^error: evalhost: \S+/\.partial-step_1/w\.bin points to nothing; a partial "
        r"folder holds only",
    ),
    # -- symlinks in the trainer's checkpoint that cannot be relayed ------------------------
    Case(
        "trainer-dangling-link",
        trainer_link(lambda c: (c / "model.safetensors").symlink_to(c / "gone.bin")),
        1,
        r"^error: step_1 was not relayed: the symlink step_1/model\.safetensors points "
        r"to nothing; replace it",
    ),
    Case(
        "trainer-link-to-folder",
        trainer_link(lambda c: (c / "weights").symlink_to(c / "sub", target_is_directory=True)),
        1,
        r"^error: step_1 was not relayed: the symlink step_1/weights points to a folder",
    ),
    Case(
        "trainer-link-to-device",
        trainer_link(lambda c: (c / "zero.bin").symlink_to("/dev/zero")),
        1,
        r"^error: step_1 was not relayed: the symlink step_1/zero\.bin does not point "
        r"to a regular file",
    ),
    Case(
        "trainer-newline-file-name",
        trainer_link(lambda c: (c / "new\nline.bin").write_bytes(b"x")),
        1,
        r"^error: step_1 was not relayed: step_1/new\\nline\.bin has a line break in its "
        r"name; rename it",
    ),
    # -- selections that cannot be honoured -------------------------------------------------
    Case(
        "named-incomplete",
        lambda e: (_ckpt(e), _ckpt(e, "step_2", marker=False), ["step_2"])[-1],
        1,
        r"^error: step_2 was not relayed: no COMPLETE marker yet$",
    ),
    Case(
        "step-incomplete",
        lambda e: (_ckpt(e), _ckpt(e, "step_2", marker=False), ["--step", "2"])[-1],
        1,
        r"^error: step_2 was not relayed: no COMPLETE marker yet$",
    ),
    Case(
        "unknown-name",
        lambda e: (_ckpt(e), ["nope"])[-1],
        2,
        r"^error: no checkpoint 'nope' in trainer:\S+ \(have: step_1\)$",
    ),
    Case(
        "name-and-all",
        lambda e: (_ckpt(e), ["step_1", "--all"])[-1],
        2,
        r"^error: choose one of CHECKPOINT names, --step, --latest or --all$",
    ),
    Case(
        "missing-src-dir",
        lambda e: (_ckpt(e), ["--src-dir", "/nonexistent/ckpts"])[-1],
        2,
        r"^error: trainer: checkpoint folder /nonexistent/ckpts does not exist; .* pass "
        r"--src-dir$",
    ),
    Case(
        "source-is-destination",
        lambda e: (_ckpt(e), ["--to", "trainer", "step_1"])[-1],
        2,
        r"^error: trainer is both the source and a destination",
    ),
    Case(
        "bad-reserve",
        lambda e: (_ckpt(e), ["--reserve", "lots", "step_1"])[-1],
        2,
        r"^error: not a size: 'lots'",
    ),
    Case(
        "reserve-exceeds-free",
        lambda e: (_ckpt(e), ["--reserve", "1P", "step_1"])[-1],
        2,
        r"^error: evalhost: not enough space in \S+: this relay needs .* short by",
    ),
    Case(
        "unmanaged-folder-in-the-way",
        _unmanaged,
        2,
        r"^error: evalhost: \S+/step_1 exists but was not relayed by dflash",
    ),
    Case(
        "eval-python-missing",
        with_inventory(lambda e: setattr(e, "eval_py", "/nonexistent/python3")),
        2,
        r"^error: evalhost: python '/nonexistent/python3' not found",
    ),
]


def _post_checks(e: TEnv, case: Case, before: dict[str, bytes]) -> None:
    assert snapshot(e.ckpt) == before, "the trainer's files changed"
    e.outside_intact()
    assert published(e.dst) == sorted(
        case.publishes + (["step_1"] if case.id == "unmanaged-folder-in-the-way" else [])
    )
    bait = getattr(e, "escape_name", None)
    if bait:  # the escaping path would have landed here
        assert not (e.evalh.root / bait).exists()
        assert not (e.dst / bait).exists()
    victim = getattr(e, "victim", None)
    if victim is not None:
        assert victim.read_bytes() == b"victim"
    if case.id == "unmanaged-folder-in-the-way":
        assert (e.dst / "step_1" / "mine.txt").read_text() == "not relayed by dflash"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_relay_bad_input(tenv, case):  # noqa: F811
    args = case.setup(tenv)
    before = snapshot(tenv.ckpt)
    proc = tenv.cli(*args)
    line = one_error_line(proc)
    assert proc.returncode == case.code, (proc.returncode, line)
    assert re.search(case.line, line), line
    _post_checks(tenv, case, before)


# ---- the host-side commands refuse hostile requests themselves ---------------------------


def _host(args: list[str], stdin: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "remote", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )


def _recv_stream(paths: list[str], data: bytes = b"evil bytes") -> bytes:
    req = json.dumps([{"path": p, "offset": 0} for p in paths]).encode()
    out = HEADER.pack(len(req)) + req
    for _ in paths:
        out += HEADER.pack(len(data)) + data
    return out


def _recv_case(path: str, plant: Callable[[Path], None] | None = None):
    def run(root: Path) -> subprocess.CompletedProcess:
        if plant:
            plant(root)
        return _host(["relay-recv", "--", str(root / "drafters")], _recv_stream([path]))

    return run


def _publish_case(name: str, files: list[dict], plant: Callable[[Path], None] | None = None):
    def run(root: Path) -> subprocess.CompletedProcess:
        if plant:
            plant(root)
        manifest = {"format": "dflash-manifest/1", "files": files}
        return _host(
            ["relay-publish", "--kind=dir", "--", str(root / "drafters"), name],
            json.dumps(manifest).encode(),
        )

    return run


def _partial_with_link(root: Path) -> None:
    part = root / "drafters" / ".partial-step_1"
    part.mkdir()
    (part / "w.bin").symlink_to(root / "outside" / "sentinel.bin")


def _partial_with_dir_link(root: Path) -> None:
    part = root / "drafters" / ".partial-step_1"
    part.mkdir()
    (part / "sub").symlink_to(root / "outside", target_is_directory=True)


HOST_CASES = [
    (
        "recv-dotdot",
        _recv_case(".partial-step_1/../../outside/x.bin"),
        r"refusing to write '\.partial-step_1/\.\./\.\./outside/x\.bin': the path is not a "
        r"plain relative path",
    ),
    (
        "recv-absolute",
        _recv_case("/tmp/dflash-evil.bin"),
        r"refusing to write '/tmp/dflash-evil\.bin': the path is absolute",
    ),
    (
        "recv-not-in-partial",
        _recv_case("step_1/w.bin"),
        r"refusing to write 'step_1/w\.bin': the path is neither in a partial folder nor a "
        r"repair file",
    ),
    ("recv-newline", _recv_case(".partial-step_1/a\nb"), r"the path holds a NUL or line break"),
    (
        "recv-through-file-link",
        _recv_case(".partial-step_1/w.bin", _partial_with_link),
        r"refusing to write through the symlink \.partial-step_1/w\.bin",
    ),
    (
        "recv-through-dir-link",
        _recv_case(".partial-step_1/sub/x.bin", _partial_with_dir_link),
        r"refusing to write step_1/sub/x\.bin through the symlink \.partial-step_1/sub",
    ),
    (
        "publish-name-escapes",
        _publish_case("../outside", []),
        r"refusing to publish '\.\./outside': the name is not a plain relative path",
    ),
    (
        "publish-manifest-path-escapes",
        _publish_case(
            "step_1",
            [{"path": "../../outside/sentinel.bin", "size": 7}],
            lambda r: (r / "drafters" / ".partial-step_1").mkdir(),
        ),
        r"refusing to publish step_1: the manifest path '\.\./\.\./outside/sentinel\.bin' is "
        r"not a plain relative path",
    ),
    (
        "publish-file-is-a-link",
        _publish_case("step_1", [{"path": "w.bin", "size": 7}], _partial_with_link),
        r"refusing to publish step_1: w\.bin in \S+ is a symlink",
    ),
    (
        "publish-through-dir-link",
        _publish_case("step_1", [{"path": "sub/sentinel.bin", "size": 7}], _partial_with_dir_link),
        r"refusing to write step_1/sub/sentinel\.bin through the symlink \.partial-step_1/sub",
    ),
]


@pytest.mark.parametrize("run,line", [c[1:] for c in HOST_CASES], ids=[c[0] for c in HOST_CASES])
def test_host_side_command_refuses(tmp_path, run, line):
    (tmp_path / "drafters").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "sentinel.bin").write_bytes(b"keep me")
    proc = run(tmp_path)
    err = proc.stderr.decode()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 3 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(line, lines[0]), lines[0]
    assert sorted(os.listdir(tmp_path / "outside")) == ["sentinel.bin"]
    assert (tmp_path / "outside" / "sentinel.bin").read_bytes() == b"keep me"
    assert not os.path.exists("/tmp/dflash-evil.bin")
    assert not [p for p in os.listdir(tmp_path / "drafters") if not p.startswith(".")]
