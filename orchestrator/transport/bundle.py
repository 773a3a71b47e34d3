"""The remote bundle: `remote/` packed as ONE zipapp named by its content hash.

A host gets ``<workdir>/bundles/dflash-remote-<hash>.pyz`` only when it lacks that exact
file, so an unchanged bundle costs one ``test -f``, and none once this process has seen it
there; `ensure_and_find` looks for other files (a job's inputs) in that same round trip.
The host's own python runs it: ``python bundle.pyz COMMAND ...``. The name is a hash of
the files that go into it (paths and bytes), so the same source always has the same name;
the archive (sorted entries, fixed timestamps) is only built when a host lacks it.
"""

from __future__ import annotations

import hashlib
import io
import json
import marshal
import threading
import weakref
import zipfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib.util import MAGIC_NUMBER, source_hash
from pathlib import Path
from typing import NamedTuple

from orchestrator.errors import RemoteCommandError
from orchestrator.transport.hosts import (
    SHA256_FUNCTION,
    Host,
    HostError,
    Result,
    command_line,
    last_line,
    quote,
)

REMOTE_PACKAGE = Path(__file__).resolve().parents[2] / "remote"
ERROR_PREFIX = "dflash-remote: error: "
EXIT_USER_ERROR = 3
MAIN = b"import sys\nfrom remote.cli import main\nsys.exit(main())\n"


def _sources() -> list[tuple[str, bytes]]:
    """(name in the archive, content) of every file of the bundle, in archive order."""
    files = sorted(
        p
        for p in REMOTE_PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    out = [("remote/" + p.relative_to(REMOTE_PACKAGE).as_posix(), p.read_bytes()) for p in files]
    return [*out, ("__main__.py", MAIN)]


@lru_cache(maxsize=1)
def bundle_name() -> str:
    """The bundle's file name, named by the content of what goes into it (no archive is
    built for it: compressing it cost every command's start about 15 ms, and is needed
    only to push it)."""
    digest = hashlib.sha256(MAGIC_NUMBER)  # the bytecode's version is in it too (`build`)
    for arc, data in _sources():
        digest.update(f"{arc}\0{len(data)}\0".encode())
        digest.update(data)
    return f"dflash-remote-{digest.hexdigest()[:16]}.pyz"


@lru_cache(maxsize=1)
def build() -> tuple[str, bytes]:
    """(file name, zipapp bytes) for the current `remote/` sources, each module with its
    bytecode beside it (`_pyc`)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in _sources():
            _add(zf, arc, data)
            if arc.endswith(".py") and arc != "__main__.py":
                _add(zf, arc + "c", _pyc(arc, data))
    return bundle_name(), buf.getvalue()


def _pyc(arc: str, source: bytes) -> bytes:
    """The bytecode of one module as zipimport reads it beside its source (PEP 552,
    unchecked hash: no timestamps). A module in a zip is otherwise compiled at every
    import, about 20 ms of every host-side command's start; a host whose python is
    another version finds the magic number wrong and compiles the source as before."""
    code = compile(source, arc, "exec", dont_inherit=True)
    flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source
    return MAGIC_NUMBER + flags + source_hash(source) + marshal.dumps(code)


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


# (id(host), bundle name) -> (that host, whether this process pushed it). The host itself
# is kept (weakly) and compared: an id is reused once its object is gone, and a stale entry
# made a later host look as if it had the bundle (python then failed on the missing file,
# seen as a flaky relay test).
_pushed: dict[tuple[int, str], tuple[weakref.ref, bool]] = {}
_push_lock = threading.Lock()


def _known(host: Host, name: str) -> bool:
    with _push_lock:
        ref, _ = _pushed.get((id(host), name), (None, False))
        return ref is not None and ref() is host


def _remember(host: Host, name: str, pushed: bool = False) -> None:
    with _push_lock:
        _pushed[(id(host), name)] = (weakref.ref(host), pushed)


def was_pushed(host: Host) -> bool:
    """Whether this process pushed the current bundle to `host` (for a one-line notice)."""
    name = bundle_name()
    with _push_lock:
        ref, pushed = _pushed.get((id(host), name), (None, False))
        return pushed and ref is not None and ref() is host


class Found(NamedTuple):
    """`ensure_and_find`'s answer."""

    path: str  # the bundle on the host
    pushed: bool  # whether it was pushed by this call
    missing: frozenset[str]  # those of the asked paths the host lacks


def ensure(host: Host) -> tuple[str, bool]:
    """Make sure `host` has the current bundle; returns (remote path, whether pushed now)."""
    found = ensure_and_find(host, {})
    return found.path, found.pushed


def ensure_and_find(host: Host, files: Mapping[str, str]) -> Found:
    """`ensure`, and which of `files` (path on the host -> sha256) the host lacks, in ONE
    round trip: the bundle is looked for in the same shell command unless this process
    already saw it on `host`. A file whose content differs from its sha256 (an upload cut
    by an older dflash) counts as missing. Nothing at all is sent when the bundle is known
    and `files` is empty."""
    name = bundle_name()
    path = f"{host.workdir}/bundles/{name}"
    # The bundle is looked for by name alone: its name is its sources' hash, and only
    # `put_bytes`, which checks what arrived, ever gives a file that name.
    look = ([] if _known(host, name) else [(path, "")]) + list(files.items())
    missing: set[str] = set()
    if look:
        # NUL-separated: a path may hold any character but NUL.
        script = (
            f"{SHA256_FUNCTION}; while [ $# -gt 0 ]; do "
            '{ [ -f "$1" ] && { [ -z "$2" ] || [ "$(dflash_sha256 "$1")" = "$2" ]; }; } '
            "|| printf '%s\\0' \"$1\"; shift 2; done"
        )
        argv = [a for pair in look for a in pair]
        out = host.run(["sh", "-c", script, "sh", *argv], check=True, timeout=120).stdout
        missing = {p for p in out.split("\0") if p}
    pushed = path in missing
    if pushed:
        host.put_bytes(build()[1], path)
    if not _known(host, name):
        _remember(host, name, pushed)
    return Found(path, pushed, frozenset(missing & set(files)))


def remote_command(host: Host, argv: Sequence[str], python_flags: Sequence[str] = ()) -> str:
    """The shell line that runs the bundle with `argv` on `host` (pushing it if needed);
    `python_flags` go to the interpreter (``-I -S`` for stdlib-only commands)."""
    name = bundle_name()
    if not _known(host, name):
        ensure(host)
    return _line(host, name, argv, python_flags)


def _shell_path(host: Host, name: str) -> str:
    """The bundle's path on `host` as one shell word; a home-relative workdir (the default
    ``~/.dflash``) stays for the host's shell to expand (`Host.shell_word`): asking the
    host for its home first cost a whole command per host, before its first real one."""
    return host.shell_word(f"{host.spec.workdir.rstrip('/')}/bundles/{name}")


def _line(host: Host, name: str, argv: Sequence[str], python_flags: Sequence[str]) -> str:
    python = command_line([host.spec.python, *python_flags])
    return " ".join([python, _shell_path(host, name), *(quote(a) for a in argv)])


_MISSING = "dflash-bundle-missing"
_EXIT_MISSING = 97


def first_line(
    host: Host, argv: Sequence[str], python_flags: Sequence[str] = ()
) -> tuple[str, bool]:
    """(shell line, guarded): runs bundle command `argv` on `host` with no round trip to
    check for the bundle first. Until this process has seen the bundle there, the line is
    guarded: where the bundle is absent it runs nothing and exits saying so (`was_missing`
    tells), and the caller pushes it with `remote_command` and runs that line instead."""
    name = bundle_name()
    line = _line(host, name, argv, python_flags)
    if _known(host, name):
        return line, False
    guarded = (
        f"if [ -f {_shell_path(host, name)} ]; then exec {line}; else echo {_MISSING} >&2; "
        f"exit {_EXIT_MISSING}; fi"
    )
    return guarded, True


def was_missing(host: Host, code: int, stderr: str) -> bool:
    """Whether a guarded line (`first_line`) that ended with `code` and `stderr` found no
    bundle; else the bundle is known to be on `host` from now on."""
    if code == _EXIT_MISSING and _MISSING in stderr:
        return True
    seen(host)
    return False


def seen(host: Host) -> None:
    """A guarded line (`first_line`) answered from the bundle: it is on `host`, and later
    commands there need no guard (nor a check)."""
    _remember(host, bundle_name())


def run_remote(
    host: Host,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    stdin: bytes | None = None,
    python_flags: Sequence[str] = (),
) -> Result:
    """Run a bundle command; a remote user error or a missing python becomes one line.

    The first call on a host runs the command only if the bundle is there and pushes it
    otherwise, so a host that has it costs no separate check (one round trip, not two).
    """
    line, guarded = first_line(host, argv, python_flags)
    result = host.run(line, check=False, timeout=timeout, stdin=stdin)
    if guarded and was_missing(host, result.exit_code, result.stderr):  # push it, then run
        result = host.run(
            remote_command(host, argv, python_flags), check=False, timeout=timeout, stdin=stdin
        )
    check_result(host, result, argv)
    return result


def check_result(host: Host, result: Result, argv: Sequence[str]) -> None:
    """Raise the one-line error a failed bundle command deserves."""
    if result.ok:
        return
    if result.exit_code == 127 or (result.exit_code == 126 and "python" in result.stderr):
        raise HostError(
            f"{host.name}: python {host.spec.python!r} not found or not "
            "executable there; set 'python:' for this host in the inventory"
        )
    for line in reversed(result.stderr.splitlines()):
        if line.startswith(ERROR_PREFIX):
            raise RemoteCommandError(f"{host.name}: {line[len(ERROR_PREFIX) :]}")
    raise RemoteCommandError(
        f"{host.name}: remote {argv[0] if argv else 'command'} failed "
        f"(exit {result.exit_code}): {last_line(result.stderr)}"
    )


def run_remote_json(
    host: Host,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    python_flags: Sequence[str] = (),
    payload: dict | None = None,
) -> dict:
    """Run a bundle command that prints one JSON document and return it parsed; `payload`,
    when given, goes to its stdin as JSON (``--spec -``)."""
    stdin = None if payload is None else json.dumps(payload).encode()
    result = run_remote(host, argv, timeout=timeout, python_flags=python_flags, stdin=stdin)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteCommandError(
            f"{host.name}: remote {argv[0]} printed no JSON "
            f"({last_line(result.stdout + result.stderr)[:200]})"
        ) from None


__all__ = [
    "build",
    "bundle_name",
    "ensure",
    "ensure_and_find",
    "was_pushed",
    "remote_command",
    "run_remote",
    "run_remote_json",
    "quote",
]
