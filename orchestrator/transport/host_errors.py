"""The one `HostError` line for a host that could not be reached or refused us, on both
SSH paths."""

from __future__ import annotations

from orchestrator.errors import DflashError


class HostError(DflashError):
    """A host could not be reached or refused us; the message is one actionable line."""


def host_key_changed(where: str, got: str, listed: str = "") -> HostError:
    """A host whose key changed: always refused (`got`: its fingerprint, `listed`: FILE:LINE)."""
    old = f" ({listed})" if listed else ""
    return HostError(
        f"{where}: host key CHANGED (got {got}); refusing to connect. If the host was "
        f"reinstalled, remove its old line from known_hosts{old} and connect again"
    )


def host_key_unknown(where: str) -> HostError:
    return HostError(
        f"{where}: unknown host key, refusing to connect; verify the host and rerun with "
        "--accept-new-host-keys (or set 'accept_new_host_key: true' for it in the inventory)"
    )


def host_unresolved(name: str, hostname: str) -> HostError:
    return HostError(
        f"{name}: host name {hostname!r} does not resolve; fix "
        "'hostname' in the inventory or your ~/.ssh/config"
    )


def last_line(text: str) -> str:
    """The last non-blank line of `text`, stripped."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
