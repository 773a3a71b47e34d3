"""A `Host` whose commands run through OpenSSH ``ssh`` processes: the relay's control path.

The relay's bulk streams already go through OpenSSH clients sharing one master connection
per host (`orchestrator.transport.master.Multiplexer`). Its few short commands (scan, lock,
bundle push) go the same way: through that master, not through a second, paramiko,
connection per host. One SSH connection per host instead of two, no paramiko import or
Python-side key exchange at the start of every relay (together about a third of an
unchanged relay's wall time on the 2-core test box), and the same trust settings: the
argv is rendered from the host's `SSHSettings` like the streams' (known hosts,
StrictHostKeyChecking=yes unless opted in, keys, agent, jump hosts).

A command started before the host's master is up waits for it (`Multiplexer.wait`); a
master that failed or is switched off (``DFLASH_RELAY_MUX=0``) leaves each command to
connect on its own, so the master only ever saves time. A connection failure (ssh's exit
status 255) is one `HostError` line naming the host, as `orchestrator.transport.openssh`
reads ssh's stderr. `stream_argv` is the argv of such a command, for the relay's streams.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from orchestrator.inventory import Inventory
from orchestrator.transport.hosts import (
    Host,
    HostError,
    LocalHost,
    PipeProcess,
    Process,
    Result,
    SSHHost,
    command_line,
)
from orchestrator.transport.master import Multiplexer
from orchestrator.transport.openssh import connection_error, openssh_options


def stream_argv(
    host: Host, line: str, inventory: Inventory | None, mux: Multiplexer | None = None
) -> list[str]:
    """The local argv that runs shell command `line` on `host` with binary pipes: ``bash
    -c`` on this machine, else ``ssh`` through `mux`'s master (waiting for it to be up).
    The relay's streams and `OpenSSHHost`'s commands both run it."""
    if isinstance(host, LocalHost):
        return ["bash", "-c", line]
    if mux is not None:
        mux.wait(host)  # share the master once it is up, rather than connect anew
    extra = mux.options(host) if mux is not None else []
    return ["ssh", *openssh_options(host), *extra, host.settings.alias, line]


class OpenSSHHost(Host):
    """`host` (an `SSHHost`, not connected) reached through ``ssh`` and `mux`'s master."""

    def __init__(self, host: SSHHost, mux):
        super().__init__(host.spec)
        self.settings = host.settings
        self.mux = mux

    def _argv(self, line: str) -> list[str]:
        return stream_argv(self, line, None, self.mux)

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
