"""The remote bundle: `remote/` as ONE zipapp named by its sources' hash, pushed only to a
host that lacks that exact file."""

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
    files = sorted(
        p
        for p in REMOTE_PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    out = [("remote/" + p.relative_to(REMOTE_PACKAGE).as_posix(), p.read_bytes()) for p in files]
    return [*out, ("__main__.py", MAIN)]


@lru_cache(maxsize=1)
def bundle_name() -> str:
    """The bundle's file name, from its sources (no archive is built for it)."""
    digest = hashlib.sha256(MAGIC_NUMBER)  # the bytecode's version is in it too
    for arc, data in _sources():
        digest.update(f"{arc}\0{len(data)}\0".encode())
        digest.update(data)
    return f"dflash-remote-{digest.hexdigest()[:16]}.pyz"


@lru_cache(maxsize=1)
def build() -> tuple[str, bytes]:
    """(file name, zipapp bytes) of the current `remote/`, each module with its bytecode."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in _sources():
            _add(zf, arc, data)
            if arc.endswith(".py") and arc != "__main__.py":
                _add(zf, arc + "c", _pyc(arc, data))
    return bundle_name(), buf.getvalue()


def _pyc(arc: str, source: bytes) -> bytes:
    """A module's bytecode beside its source (PEP 552, unchecked hash): no compile per import."""
    code = compile(source, arc, "exec", dont_inherit=True)
    flags = (0b01).to_bytes(4, "little")  # hash-based, unchecked
    return MAGIC_NUMBER + flags + source_hash(source) + marshal.dumps(code)


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


# (id(host), bundle name) -> (host, pushed by us); the host is compared: ids are reused.
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
    name = bundle_name()
    with _push_lock:
        ref, pushed = _pushed.get((id(host), name), (None, False))
        return pushed and ref is not None and ref() is host


class Found(NamedTuple):
    path: str
    pushed: bool
    missing: frozenset[str]


def ensure(host: Host) -> tuple[str, bool]:
    """Make sure `host` has the current bundle; (remote path, whether pushed now)."""
    found = ensure_and_find(host, {})
    return found.path, found.pushed


def ensure_and_find(host: Host, files: Mapping[str, str]) -> Found:
    """`ensure`, and which of `files` (host path -> sha256) the host lacks, in ONE round trip."""
    name = bundle_name()
    path = f"{host.workdir}/bundles/{name}"
    # By name alone: only `put_bytes`, which checks what arrived, gives a file that name.
    look = ([] if _known(host, name) else [(path, "")]) + list(files.items())
    missing: set[str] = set()
    if look:
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
    """The shell line running the bundle with `argv` on `host`, pushing it if needed."""
    name = bundle_name()
    if not _known(host, name):
        ensure(host)
    return _line(host, name, argv, python_flags)


def _shell_path(host: Host, name: str) -> str:
    """The bundle's path as one shell word (a ``~/`` workdir left for the host to expand)."""
    return host.shell_word(f"{host.spec.workdir.rstrip('/')}/bundles/{name}")


def _line(host: Host, name: str, argv: Sequence[str], python_flags: Sequence[str]) -> str:
    python = command_line([host.spec.python, *python_flags])
    return " ".join([python, _shell_path(host, name), *(quote(a) for a in argv)])


_MISSING = "dflash-bundle-missing"
_EXIT_MISSING = 97


def first_line(
    host: Host, argv: Sequence[str], python_flags: Sequence[str] = ()
) -> tuple[str, bool]:
    """(shell line, guarded): runs `argv` on `host`, guarded until the bundle is seen there:
    where it is absent the line exits saying so."""
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
    """Whether a guarded line found no bundle; else it is known on `host` from now on."""
    if code == _EXIT_MISSING and _MISSING in stderr:
        return True
    seen(host)
    return False


def seen(host: Host) -> None:
    """The bundle answered on `host`: later commands there need no guard."""
    _remember(host, bundle_name())


def run_remote(
    host: Host,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    stdin: bytes | None = None,
    python_flags: Sequence[str] = (),
) -> Result:
    """Run a bundle command, pushing the bundle when missing; failures are one line."""
    line, guarded = first_line(host, argv, python_flags)
    result = host.run(line, check=False, timeout=timeout, stdin=stdin)
    if guarded and was_missing(host, result.exit_code, result.stderr):
        result = host.run(
            remote_command(host, argv, python_flags), check=False, timeout=timeout, stdin=stdin
        )
    check_result(host, result, argv)
    return result


def check_result(host: Host, result: Result, argv: Sequence[str]) -> None:
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
    """Run a bundle command that prints one JSON document (`payload`: its stdin); parsed."""
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
