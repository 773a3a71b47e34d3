"""The ``ssh`` command line that reaches a host, and what ssh's stderr says when it could not.

The options are rendered from the same `SSHSettings` as the host's paramiko connection
(`orchestrator.transport.ssh_settings`: ``ssh -G`` under the inventory's values), so both
reach the same address with the same keys, agent, jump hosts, known-hosts files and
StrictHostKeyChecking=yes (accept-new only when opted in). The cipher list offered is the
fastest first; OpenSSH takes the first one the server also offers. A connection failure
(ssh's exit status 255) is one `HostError` line naming the host; an unknown or changed
host key gets the same line as on paramiko's path (`host_key_error`).
"""

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
    """Ciphers this machine's ssh client supports (``ssh -Q cipher``), asked once."""
    with _ciphers_lock:  # the hosts' threads ask at once: one ssh -Q, not one each
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
    """Our preference order, restricted to what the local client knows."""
    known = local_ciphers()
    chosen = [c for c in PREFERRED_CIPHERS if c in known] if known else list(PREFERRED_CIPHERS)
    return ",".join(chosen)


def openssh_options(host: Host) -> list[str]:
    """``ssh`` options (no destination) that reach `host` like its paramiko connection
    does: both are rendered from the one `SSHSettings` resolved when the host was opened
    (`orchestrator.transport.ssh_settings`), plus our cipher preference."""
    if shutil.which("ssh") is None:
        raise DflashError(
            "the OpenSSH client 'ssh' is not installed on this machine; the "
            "relay needs it (apt install openssh-client)"
        )
    return host.settings.openssh_options(cipher_list())


# What OpenSSH says of a host key it refuses (its wording since 7.x, LogLevel=ERROR).
_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "has changed and you have requested")
_GOT = re.compile(r"sent by the remote host is\s+(\S+?)\.?\s*$", re.M)
_LISTED = re.compile(r"^Offending \S+ key in (\S+:\d+)\s*$", re.M)
_UNKNOWN = re.compile(r"^No \S+ host key is known for ", re.M)


def host_key_error(host: Host, stderr: str) -> HostError | None:
    """The line for an ssh (exit 255) that refused `host`'s key: changed (always refused,
    with the fingerprint it got and where the old key is recorded) or unknown (refused
    unless opted in); None when its key was not the problem. The same lines as paramiko's
    (`orchestrator.transport.host_errors`)."""
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


# What ssh says of a name it cannot resolve (the host's, or a jump host's).
_UNRESOLVED = re.compile(r"Could not resolve hostname (\S+?):")


def connection_error(host: Host, stderr: str) -> HostError:
    """The one line for an ssh that could not reach `host` (exit status 255)."""
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
