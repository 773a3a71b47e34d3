"""The ``ssh`` command line that reaches a host, and one `HostError` line for what its
stderr says when it could not."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import threading

from orchestrator.errors import DflashError
from orchestrator.transport.host_errors import (
    HostError,
    host_key_changed,
    host_key_unknown,
    host_unresolved,
    last_line,
)
from orchestrator.transport.hosts import Host

PREFERRED_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
    "chacha20-poly1305@openssh.com",
)


_ciphers_lock = threading.Lock()


def local_ciphers() -> tuple[str, ...]:
    """Ciphers this machine's ssh client supports, asked once."""
    with _ciphers_lock:  # the hosts' threads ask at once
        return _local_ciphers()


@functools.lru_cache(maxsize=1)
def _local_ciphers() -> tuple[str, ...]:
    try:
        out = subprocess.run(
            ["ssh", "-Q", "cipher"], capture_output=True, text=True, timeout=10
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(out)


def cipher_list() -> str:
    known = local_ciphers()
    chosen = [c for c in PREFERRED_CIPHERS if c in known] if known else list(PREFERRED_CIPHERS)
    return ",".join(chosen)


def openssh_options(host: Host) -> list[str]:
    """``ssh`` options (no destination) reaching `host`, plus our cipher preference."""
    if shutil.which("ssh") is None:
        raise DflashError(
            "the OpenSSH client 'ssh' is not installed on this machine; the "
            "relay needs it (apt install openssh-client)"
        )
    return host.settings.openssh_options(cipher_list())


# OpenSSH's words for a host key it refuses (since 7.x, LogLevel=ERROR).
_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "has changed and you have requested")
_GOT = re.compile(r"sent by the remote host is\s+(\S+?)\.?\s*$", re.M)
_LISTED = re.compile(r"^Offending \S+ key in (\S+:\d+)\s*$", re.M)
_UNKNOWN = re.compile(r"^No \S+ host key is known for ", re.M)


def host_key_error(host: Host, stderr: str) -> HostError | None:
    """The line for an ssh (exit 255) that refused `host`'s key, or None."""
    settings = getattr(host, "settings", None)
    where = f"{host.name} ({settings.address})" if settings is not None else host.name
    if any(marker in stderr for marker in _CHANGED):
        got, listed = _GOT.search(stderr), _LISTED.search(stderr)
        return host_key_changed(
            where, got.group(1) if got else "another key", listed.group(1) if listed else ""
        )
    if _UNKNOWN.search(stderr) and not (settings is not None and settings.accept_new):
        return host_key_unknown(where)
    return None


_UNRESOLVED = re.compile(r"Could not resolve hostname (\S+?):")


def connection_error(host: Host, stderr: str) -> HostError:
    """The one line for an ssh that could not reach `host` (exit 255)."""
    refused = host_key_error(host, stderr)
    if refused is not None:
        return refused
    unresolved = _UNRESOLVED.search(stderr)
    if unresolved:
        return host_unresolved(host.name, unresolved.group(1))
    why = last_line(stderr) or "ssh exit 255"
    hint = ""
    if "Permission denied" in stderr:
        hint = "; check 'user' and 'identity_file' in the inventory, or your ssh-agent"
    return HostError(f"{host.name}: cannot connect over ssh: {why}{hint}")
