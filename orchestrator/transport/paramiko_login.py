"""Logging in with paramiko (through Fabric) under a host's resolved `SSHSettings`.

What ssh would do, done by paramiko: the keys of the settings only, the agent ssh would ask
(IdentityAgent, narrowed by IdentitiesOnly: `agent`), every known-hosts file, unknown keys
refused unless opted in (then saved, as OpenSSH's ``accept-new``; a changed key always
refused), keepalives and a kernel timeout that end a connection whose host died, no rekey
stalls on multi-GB streams. Every failure is one `HostError` line (`connect`). paramiko and
Fabric are imported only when a connection is made: the relay does without them.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
from pathlib import Path

from orchestrator.transport.host_errors import (
    HostError,
    host_key_changed,
    host_key_unknown,
    host_unresolved,
)
from orchestrator.transport.ssh_settings import ALIVE_COUNT, ALIVE_INTERVAL, SSHSettings

# Paramiko logs transport failures to stderr on its own; we report them as one line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

# Paramiko rekeys every ~1 GB by default, which visibly stalls multi-GB streams.
REKEY_BYTES = 2**40


def connect(s: SSHSettings, gateway, name: str, timeout: float):
    """An open Fabric connection under settings `s` through `gateway` (a jump host's
    connection, a ProxyCommand line, or None); a failure is one `HostError` line naming
    host `name` (`timeout`: its connect timeout, for the message)."""
    import paramiko  # here, not at import: the relay reaches hosts through OpenSSH only
    from fabric import Config, Connection

    # An empty ssh_config: everything ssh_config says is already in `settings`.
    conn = Connection(
        host=s.hostname,
        user=s.user,
        port=s.port,
        gateway=gateway,
        connect_timeout=s.connect_timeout,
        connect_kwargs=s.paramiko_kwargs(),
        config=Config(ssh_config=paramiko.SSHConfig()),
    )
    client = conn.client
    for path in s.known_hosts:
        if os.path.isfile(path):
            client.load_host_keys(path)
    if s.accept_new:
        save_to = s.user_known_hosts[0] if s.user_known_hosts else "~/.ssh/known_hosts"
        client.set_missing_host_key_policy(_accept_new_policy(Path(save_to).expanduser()))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    # paramiko's SSHClient asks $SSH_AUTH_SOCK's agent; IdentityAgent may name another
    # socket and IdentitiesOnly may narrow its keys, so hand it the agent ssh would use.
    client._agent = agent(s)
    try:
        conn.open()
    except Exception as exc:  # translated into one actionable line
        raise _explain(exc, conn, name, timeout) from None
    transport = conn.client.get_transport()
    transport.packetizer.REKEY_BYTES = REKEY_BYTES
    transport.packetizer.REKEY_PACKETS = REKEY_BYTES
    transport.set_keepalive(ALIVE_INTERVAL)
    _end_when_unacknowledged(transport.sock, ALIVE_INTERVAL * ALIVE_COUNT)
    return conn


def _explain(exc: Exception, conn, name: str, timeout: float) -> HostError:
    import paramiko

    where = f"{name} ({conn.user}@{conn.host}:{conn.port})"
    if isinstance(exc, socket.gaierror):
        return host_unresolved(name, conn.host)
    if isinstance(exc, paramiko.BadHostKeyException):
        return host_key_changed(where, fingerprint(exc.key))
    if isinstance(exc, paramiko.AuthenticationException):
        return HostError(
            f"{where}: authentication failed; check 'user' and "
            "'identity_file' in the inventory, or your ssh-agent"
        )
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return host_key_unknown(where)
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or isinstance(
        exc, ConnectionRefusedError
    ):
        return HostError(f"{where}: connection refused; is sshd running and is the port right?")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HostError(
            f"{where}: connection timed out after {timeout}s;"
            " check the network, the port, or 'connect_timeout'"
        )
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError)):
        # A port that closes at once can reset our banner's write instead (a busy box)
        return HostError(
            f"{where}: closed the connection during the SSH handshake (reset); "
            "is that port really sshd, and does it accept this machine?"
        )
    if isinstance(exc, paramiko.SSHException) and (
        "banner" in str(exc) or "No existing session" in str(exc)
    ):
        # closed at once (an EOF, or a reset on a busy box): no waiting involved
        if isinstance(exc.__context__, (EOFError, ConnectionError)):
            return HostError(
                f"{where}: closed the connection before any SSH greeting; "
                "is that port really sshd, and does it accept this machine?"
            )
        return HostError(
            f"{where}: no SSH greeting within {timeout}s (timed out); is that port really sshd?"
        )
    if isinstance(exc, OSError):
        return HostError(f"{where}: cannot connect: {exc.strerror or exc}")
    if isinstance(exc, paramiko.SSHException):
        return HostError(f"{where}: SSH error: {exc}")
    return HostError(f"{where}: cannot connect: {type(exc).__name__}: {exc}")


def fingerprint(key) -> str:
    """A paramiko key's fingerprint as OpenSSH shows it (``SHA256:<base64>``)."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _end_when_unacknowledged(sock, seconds: float) -> None:
    """A dead peer ends the connection, and every wait on it, within `seconds`: what the
    socket sent (a keepalive at least, every ALIVE_INTERVAL s) unacknowledged that long
    makes the kernel drop it (Linux TCP_USER_TIMEOUT), and paramiko's reads then end,
    where otherwise TCP retransmits for a quarter of an hour or more. A connection that
    is no plain socket (a jump host's channel: that hop's own socket has the timeout; a
    ProxyCommand's pipe) or a system without the option keeps TCP's own limits."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None or not isinstance(sock, socket.socket):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
    except OSError:
        pass


def _accept_new_policy(save_to: Path):
    """OpenSSH's ``StrictHostKeyChecking=accept-new`` as a paramiko policy: trust and save
    an UNKNOWN key.

    A key that differs from a known one never reaches a policy: paramiko raises
    BadHostKeyException first, so changed keys stay refused.
    """
    import paramiko

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)
            save_to.parent.mkdir(parents=True, exist_ok=True)
            with open(save_to, "a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

    return AcceptNew()


def agent(settings: SSHSettings):
    """A paramiko agent client for `settings.identity_agent` offering only what ssh would offer
    (with IdentitiesOnly, the keys whose ``.pub`` files are among the identities),
    or None."""
    if settings.identity_agent is None:
        return None
    only = None
    if settings.identities_only:
        only = {_pub_blob(f) for f in settings.identity_files} - {None}
    return _socket_agent(settings.identity_agent, only)


def _pub_blob(key_file: str) -> bytes | None:
    """The public key blob of ``KEY.pub`` (or ``KEY-cert.pub``), or None."""
    for pub in (key_file + ".pub", key_file + "-cert.pub"):
        try:
            with open(pub) as fh:
                return base64.b64decode(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return None


def _socket_agent(path: str, only: set[bytes] | None):
    """paramiko's agent client for a socket of our choosing (IdentityAgent), offering only
    `only` (public key blobs) when given. paramiko's own `Agent` reads $SSH_AUTH_SOCK.
    (paramiko is imported here, not with this module: the relay does without it.)"""
    import paramiko.agent

    class SocketAgent(paramiko.agent.AgentSSH):
        def __init__(self):
            super().__init__()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                return  # no agent there: no keys, as with ssh
            self._connect(sock)

        def get_keys(self):
            keys = super().get_keys()
            if only is None:
                return keys
            return tuple(k for k in keys if k.asbytes() in only)

        def close(self) -> None:
            self._close()

    return SocketAgent()
