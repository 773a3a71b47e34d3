"""Logging in with paramiko (through Fabric) as ssh would, under a host's `SSHSettings`."""

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

# We report transport failures as one line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

# Paramiko's default rekey every ~1 GB stalls multi-GB streams.
REKEY_BYTES = 2**40


def connect(s: SSHSettings, gateway, name: str, timeout: float):
    """An open Fabric connection under `s` through `gateway`; failure is one `HostError`."""
    import paramiko  # the relay does without it
    from fabric import Config, Connection

    # An empty ssh_config: `s` holds what it says.
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
    # IdentityAgent may differ from $SSH_AUTH_SOCK's.
    client._agent = agent(s)
    try:
        conn.open()
    except Exception as exc:
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
        # A busy box may reset our banner's write instead
        return HostError(
            f"{where}: closed the connection during the SSH handshake (reset); "
            "is that port really sshd, and does it accept this machine?"
        )
    if isinstance(exc, paramiko.SSHException) and (
        "banner" in str(exc) or "No existing session" in str(exc)
    ):
        # closed at once: no waiting involved
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
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _end_when_unacknowledged(sock, seconds: float) -> None:
    """Drop the connection once what it sent is unacknowledged `seconds` (TCP_USER_TIMEOUT)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None or not isinstance(sock, socket.socket):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
    except OSError:
        pass


def _accept_new_policy(save_to: Path):
    """``accept-new`` as a paramiko policy: trust and save an UNKNOWN key."""
    import paramiko

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)
            save_to.parent.mkdir(parents=True, exist_ok=True)
            with open(save_to, "a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

    return AcceptNew()


def agent(settings: SSHSettings):
    """An agent client for `settings.identity_agent` with the keys ssh would offer, or None."""
    if settings.identity_agent is None:
        return None
    only = None
    if settings.identities_only:
        only = {_pub_blob(f) for f in settings.identity_files} - {None}
    return _socket_agent(settings.identity_agent, only)


def _pub_blob(key_file: str) -> bytes | None:
    for pub in (key_file + ".pub", key_file + "-cert.pub"):
        try:
            with open(pub) as fh:
                return base64.b64decode(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return None


def _socket_agent(path: str, only: set[bytes] | None):
    """paramiko's agent client for socket `path`, offering only `only` when given."""
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
