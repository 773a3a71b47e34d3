"""A `Host` whose commands run through ``ssh`` and the host's master: the relay's control
path, sharing one connection with its streams."""

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
    """The argv running shell `line` on `host`: ``bash -c`` here, else ``ssh`` via `mux`."""
    if isinstance(host, LocalHost):
        return ["bash", "-c", line]
    if mux is not None:
        mux.wait(host)
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
    return OpenSSHHost(host, mux) if isinstance(host, SSHHost) else host
