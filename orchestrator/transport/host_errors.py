"""What a host that could not be reached or refused us is told as: one `HostError` line.

Shared by every part of the transport (the settings, both SSH stacks, the bundle) and
importing none of them: the messages for a host key that changed or is unknown are the
same on paramiko's path and OpenSSH's, and `last_line` picks what a failed command said.
"""

from __future__ import annotations

from orchestrator.errors import DflashError


class HostError(DflashError):
    """A host could not be reached or refused us; the message is one actionable line."""


def host_key_changed(where: str, got: str, listed: str = "") -> HostError:
    """The one line for a host whose key differs from the one on record, on every path
    (paramiko's connection, the relay's OpenSSH ones): always refused, whatever the
    opt-in for unknown keys; `got` is the key's fingerprint as ``ssh-keygen -l`` shows it,
    `listed` where the old key is recorded (``FILE:LINE``), when known."""
    old = f" ({listed})" if listed else ""
    return HostError(
        f"{where}: host key CHANGED (got {got}); refusing to connect. If the host was "
        f"reinstalled, remove its old line from known_hosts{old} and connect again"
    )


def host_key_unknown(where: str) -> HostError:
    """The one line for a host whose key is on no record (refused unless opted in)."""
    return HostError(
        f"{where}: unknown host key, refusing to connect; verify the host and rerun with "
        "--accept-new-host-keys (or set 'accept_new_host_key: true' for it in the inventory)"
    )


def host_unresolved(name: str, hostname: str) -> HostError:
    """The one line for a host whose name does not resolve, on every path (paramiko's
    connection, OpenSSH's commands and the relay's streams)."""
    return HostError(
        f"{name}: host name {hostname!r} does not resolve; fix "
        "'hostname' in the inventory or your ~/.ssh/config"
    )


def last_line(text: str) -> str:
    """The last non-blank line of `text` (a command's stderr: what it said last), stripped."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
