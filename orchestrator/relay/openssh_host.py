"""A `Host` whose commands run through OpenSSH ``ssh`` processes: the relay's control path.

The relay's bulk streams already go through OpenSSH clients sharing one master connection
per host (`orchestrator.relay.stream.Multiplexer`). Its few short commands (scan, lock,
bundle push) go the same way: through that master, not through a second, paramiko,
connection per host. One SSH connection per host instead of two, no paramiko import or
Python-side key exchange at the start of every relay (together about a third of an
unchanged relay's wall time on the 2-core test box), and the same trust settings: the
argv is rendered from the host's `SSHSettings` like the streams' (known hosts,
StrictHostKeyChecking=yes unless opted in, keys, agent, jump hosts).

A command started before the host's master is up waits for it (`Multiplexer.wait`); a
master that failed or is switched off (``DFLASH_RELAY_MUX=0``) leaves each command to
connect on its own, so the master only ever saves time. A connection failure (ssh's exit
status 255) is one `HostError` line naming the host; an unknown or changed host key gets
the same line as on paramiko's path (`host_key_error`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from orchestrator.transport.hosts import (
    Host,
    HostError,
    PipeProcess,
    Process,
    Result,
    SSHHost,
    command_line,
    host_key_changed,
    host_key_unknown,
    last_line,
)

# What OpenSSH says of a host key it refuses (its wording since 7.x, LogLevel=ERROR).
_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "has changed and you have requested")
_GOT = re.compile(r"sent by the remote host is\s+(\S+?)\.?\s*$", re.M)
_LISTED = re.compile(r"^Offending \S+ key in (\S+:\d+)\s*$", re.M)
_UNKNOWN = re.compile(r"^No \S+ host key is known for ", re.M)


def host_key_error(host: Host, stderr: str) -> HostError | None:
    """The line for an ssh (exit 255) that refused `host`'s key: changed (always refused,
    with the fingerprint it got and where the old key is recorded) or unknown (refused
    unless opted in); None when its key was not the problem. The same lines as paramiko's
    (`orchestrator.transport.hosts.host_key_changed`)."""
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


def connection_error(host: Host, stderr: str) -> HostError:
    """The one line for an ssh that could not reach `host` (exit status 255)."""
    refused = host_key_error(host, stderr)
    if refused is not None:
        return refused
    why = last_line(stderr) or "ssh exit 255"
    hint = ""
    if "Permission denied" in stderr:
        hint = "; check 'user' and 'identity_file' in the inventory, or your ssh-agent"
    return HostError(f"{host.name}: cannot connect over ssh: {why}{hint}")


class OpenSSHHost(Host):
    """`host` (an `SSHHost`, not connected) reached through ``ssh`` and `mux`'s master."""

    def __init__(self, host: SSHHost, mux):
        super().__init__(host.spec)
        self.settings = host.settings
        self.mux = mux

    def _argv(self, line: str) -> list[str]:
        from orchestrator.relay.stream import openssh_options

        extra: list[str] = []
        if self.mux is not None:
            self.mux.wait(self)
            extra = self.mux.options(self)
        return ["ssh", *openssh_options(self), *extra, self.settings.alias, line]

    def _run(self, line: str, *, timeout: float | None, stdin: bytes | None) -> Result:
        try:
            proc = subprocess.run(
                self._argv(line),
                input=stdin or b"",
                capture_output=True,
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: command timed out after {timeout}s") from None
        err = proc.stderr.decode(errors="replace")
        if proc.returncode == 255:
            raise connection_error(self, err)
        return Result(proc.stdout.decode(errors="replace"), err, proc.returncode)

    def popen(self, command: str | Sequence[str]) -> Process:
        return PipeProcess(self._argv(command_line(command)))


def control_host(host: Host, mux) -> Host:
    """The host the relay's commands use: an `OpenSSHHost` for an SSH host (through
    `mux`'s master when there is one), the host itself otherwise (local)."""
    return OpenSSHHost(host, mux) if isinstance(host, SSHHost) else host
