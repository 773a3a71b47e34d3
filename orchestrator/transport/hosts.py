"""One interface over the machines dflash drives: SSH hosts (Fabric) and the local machine.

`open_host(spec)` returns a `Host`. Every command is given either as an argument list, which
is shell-quoted here (so a path like ``a b;$(rm -rf ~)`` is one literal argument), or as a
string the caller has built with `quote`. The local transport runs the same command strings
through ``bash -c``, so the embedded demo exercises the same code path as a real host.

SSH specifics:
- Connections honour ``~/.ssh/config`` as OpenSSH reads it (``ssh -G``, see
  `orchestrator.transport.ssh_settings`, shared with the relay's ssh streams): Include, Match,
  keys, IdentityAgent, IdentitiesOnly, ProxyJump/ProxyCommand, known-hosts files.
- Unknown host keys are REFUSED unless the user opts in (`accept_new_host_key`, or
  ``--accept-new-host-keys``); an accepted key is saved like OpenSSH's ``accept-new``.
  A changed key is always refused. Fabric's default would trust any key silently.
- Connection failures become one-line `HostError`s: name does not resolve, connection
  refused, timeout, authentication failed, host key unknown or changed.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import socket
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.inventory import HostSpec
from orchestrator.transport import ssh_settings

# HostError and last_line belong to a Host's interface too: re-exported, the same objects
from orchestrator.transport.host_errors import HostError as HostError
from orchestrator.transport.host_errors import host_key_changed, host_key_unknown
from orchestrator.transport.host_errors import last_line as last_line
from orchestrator.transport.ssh_settings import ALIVE_COUNT, ALIVE_INTERVAL, SSHSettings

# Paramiko logs transport failures to stderr on its own; we report them as one line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

# Large windows and packets keep a single channel near line rate; far beyond 2 MiB
# paramiko gets slower (its channel buffer's recv cost grows with what is buffered).
WINDOW_SIZE = 2 * 1024 * 1024
MAX_PACKET_SIZE = 256 * 1024
# Paramiko rekeys every ~1 GB by default, which visibly stalls multi-GB streams.
REKEY_BYTES = 2**40


def fingerprint(key) -> str:
    """A paramiko key's fingerprint as OpenSSH shows it (``SHA256:<base64>``)."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def quote(arg: str | os.PathLike) -> str:
    """Shell-quote one argument for a remote POSIX shell."""
    return shlex.quote(os.fspath(arg))


def command_line(command: str | Sequence[str]) -> str:
    """A shell command line: argument lists are quoted, strings are used as given."""
    if isinstance(command, str):
        return command
    return " ".join(quote(a) for a in command)


@dataclass
class Result:
    stdout: str
    stderr: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Process:
    """A running remote (or local) command with binary pipes, for streaming bulk data.

    `read` returns b"" at end of output; `write` and `close_stdin` feed its input;
    `wait` returns the exit code. Standard error is collected, never left to block.
    """

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close_stdin(self) -> None:
        raise NotImplementedError

    def wait(self) -> int:
        raise NotImplementedError

    def stderr(self) -> str:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class Host:
    """A machine we run commands on. Subclasses: `SSHHost`, `LocalHost`."""

    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.name = spec.name
        self._home: str | None = None

    # -- commands ---------------------------------------------------------------------
    def run(
        self,
        command: str | Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> Result:
        """Run a command to completion and capture its output (text).

        With `check`, a non-zero exit raises `HostError` carrying the command's last
        stderr line.
        """
        result = self._run(command_line(command), timeout=timeout, stdin=stdin)
        if check and not result.ok:
            raise HostError(
                f"{self.name}: command failed (exit {result.exit_code}): "
                f"{last_line(result.stderr) or command_line(command)[:200]}"
            )
        return result

    def _run(self, line: str, *, timeout: float | None, stdin: bytes | None) -> Result:
        raise NotImplementedError

    def popen(self, command: str | Sequence[str]) -> Process:
        """Start a command with binary stdin/stdout pipes (see `Process`)."""
        raise NotImplementedError

    # -- files ------------------------------------------------------------------------
    def put_bytes(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write `data` to `path` atomically: a hidden temp file, then a rename."""
        tmp = f"{path}.partial-{os.getpid()}-{threading.get_ident()}"
        parent = os.path.dirname(path) or "."
        proc = self.popen(
            f"mkdir -p {quote(parent)} && cat > {quote(tmp)} && "
            f"chmod {mode:o} {quote(tmp)} && mv -f {quote(tmp)} {quote(path)}"
        )
        proc.write(data)
        proc.close_stdin()
        if proc.wait() != 0:
            self.run(["rm", "-f", tmp], check=False)
            raise HostError(f"{self.name}: could not write {path}: {last_line(proc.stderr())}")

    def get_bytes(self, path: str) -> bytes:
        """The contents of a file on the host."""
        proc = self.popen(["cat", "--", path])
        proc.close_stdin()
        chunks = []
        while chunk := proc.read(1 << 20):
            chunks.append(chunk)
        if proc.wait() != 0:
            raise HostError(f"{self.name}: could not read {path}: {last_line(proc.stderr())}")
        return b"".join(chunks)

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).ok

    @property
    def home(self) -> str:
        if self._home is None:
            home = self.run('printf %s "$HOME"').stdout
            # The host's answer becomes part of every path dflash sends back to it: one that
            # is not an absolute path on one line would place files somewhere else.
            if not home.startswith("/") or any(c in home for c in "\n\r\0"):
                raise HostError(
                    f"{self.name}: its $HOME is not an absolute path ({home[:80]!r}); "
                    "give the host an absolute workdir in the inventory"
                )
            self._home = home
        return self._home

    def expand(self, path: str) -> str:
        """Expand a leading ``~`` with the HOST's home (quoting would stop the shell doing it)."""
        if path == "~":
            return self.home
        if path.startswith("~/"):
            return self.home.rstrip("/") + path[1:]
        return path

    def shell_word(self, path: str) -> str:
        """`path` quoted as one word for this host's shell. A leading ``~/`` stays
        unquoted for that shell to expand when this process has not looked up the home
        (`home` costs a command on the host): ``~/.dflash`` -> ``~/.dflash``."""
        if self._home is None and path.startswith("~/") and len(path) > 2:
            return "~/" + quote(path[2:])
        return quote(self.expand(path))

    @property
    def workdir(self) -> str:
        return self.expand(self.spec.workdir)

    def connect(self) -> None:
        """Open the way to the host now rather than at the first command (SSH: log in)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# ---- local ------------------------------------------------------------------------------


class PipeProcess(Process):
    """A local process (`argv`) with binary stdin/stdout pipes and stderr collected in a
    file: a `LocalHost` command (``bash -c LINE``) or an OpenSSH ``ssh`` client. It runs in
    its own session, so a Ctrl-C reaches dflash, which ends it."""

    def __init__(self, argv: Sequence[str]):
        self._err = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            start_new_session=True,
        )

    def read(self, n: int) -> bytes:
        return self._proc.stdout.read1(n)

    def write(self, data: bytes) -> None:
        self._proc.stdin.write(data)
        self._proc.stdin.flush()  # delivered now: a request/answer dialogue waits on it

    def close_stdin(self) -> None:
        if not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass

    def wait(self) -> int:
        self.close_stdin()
        code = self._proc.wait()
        self._proc.stdout.close()
        return code

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()


class LocalHost(Host):
    """This machine, through the same command strings an SSH host would run."""

    def _run(self, line: str, *, timeout: float | None, stdin: bytes | None) -> Result:
        try:
            proc = subprocess.run(
                ["bash", "-c", line], input=stdin, capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: command timed out after {timeout}s") from None
        return Result(
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
            proc.returncode,
        )

    def popen(self, command: str | Sequence[str]) -> Process:
        return PipeProcess(["bash", "-c", command_line(command)])

    @property
    def home(self) -> str:
        return os.path.expanduser("~")


# ---- ssh --------------------------------------------------------------------------------


class _ChannelProcess(Process):
    def __init__(self, transport, line: str):
        self._chan = transport.open_session(
            window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET_SIZE
        )
        self._chan.exec_command(line)
        self._err: list[bytes] = []

    def read(self, n: int) -> bytes:
        data = self._chan.recv(n)
        self._drain_stderr()
        return data

    def write(self, data: bytes) -> None:
        self._chan.sendall(data)

    def close_stdin(self) -> None:
        self._chan.shutdown_write()

    def wait(self) -> int:
        code = self._chan.recv_exit_status()
        self._drain_stderr()
        return code

    def _drain_stderr(self) -> None:
        while self._chan.recv_stderr_ready():
            self._err.append(self._chan.recv_stderr(65536))

    def stderr(self) -> str:
        self._drain_stderr()
        return b"".join(self._err).decode(errors="replace")

    def kill(self) -> None:
        self._chan.close()


class SSHHost(Host):
    """A host reached over SSH through a Fabric `Connection` (opened lazily, reused).

    `settings` (`ssh_settings.resolve`) says how: the same values the relay's OpenSSH
    streams get. A jump host is another `SSHHost` whose connection carries this one."""

    def __init__(self, spec: HostSpec, settings: SSHSettings):
        super().__init__(spec)
        self.settings = settings
        self._jump = SSHHost(_hop_spec(settings.jump), settings.jump) if settings.jump else None
        self._conn = None
        self._lock = threading.Lock()

    @property
    def connection(self):
        """The open Fabric connection (connecting on first use)."""
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            return self._conn

    def _connect(self):
        import paramiko  # here, not at import: the relay reaches hosts through OpenSSH only
        from fabric import Config, Connection

        s = self.settings
        gateway = self._jump.connection if self._jump else s.proxy_command_line()
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
        client._agent = s.agent()
        try:
            conn.open()
        except Exception as exc:  # translated into one actionable line
            raise self._explain(exc, conn) from None
        transport = conn.client.get_transport()
        transport.packetizer.REKEY_BYTES = REKEY_BYTES
        transport.packetizer.REKEY_PACKETS = REKEY_BYTES
        transport.set_keepalive(ALIVE_INTERVAL)
        _end_when_unacknowledged(transport.sock, ALIVE_INTERVAL * ALIVE_COUNT)
        return conn

    def _explain(self, exc: Exception, conn) -> HostError:
        import paramiko

        where = f"{self.name} ({conn.user}@{conn.host}:{conn.port})"
        if isinstance(exc, socket.gaierror):
            return HostError(
                f"{self.name}: host name {conn.host!r} does not resolve; fix "
                "'hostname' in the inventory or your ~/.ssh/config"
            )
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
                f"{where}: connection timed out after {self.spec.connect_timeout}s;"
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
                f"{where}: no SSH greeting within {self.spec.connect_timeout}s "
                "(timed out); is that port really sshd?"
            )
        if isinstance(exc, OSError):
            return HostError(f"{where}: cannot connect: {exc.strerror or exc}")
        if isinstance(exc, paramiko.SSHException):
            return HostError(f"{where}: SSH error: {exc}")
        return HostError(f"{where}: cannot connect: {type(exc).__name__}: {exc}")

    def connect(self) -> None:
        self.connection  # noqa: B018  (the property logs in on first use)

    @property
    def transport(self):
        return self.connection.client.get_transport()

    def _run(self, line: str, *, timeout: float | None, stdin: bytes | None) -> Result:
        proc = self.popen(line)
        if timeout is not None:
            proc._chan.settimeout(timeout)
        out: list[bytes] = []
        try:
            if stdin:
                proc.write(stdin)
            proc.close_stdin()
            while chunk := proc.read(1 << 20):
                out.append(chunk)
            code = proc.wait()
        except TimeoutError:
            proc.kill()
            raise HostError(f"{self.name}: command timed out after {timeout}s") from None
        return Result(b"".join(out).decode(errors="replace"), proc.stderr(), code)

    def popen(self, command: str | Sequence[str]) -> Process:
        return _ChannelProcess(self.transport, command_line(command))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        if self._jump:
            self._jump.close()


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


def open_host(spec: HostSpec, inventory=None) -> Host:
    """A `Host` for an inventory entry. The connection opens on first use.

    For SSH hosts the settings are resolved here, once (`ssh_settings.resolve`: ssh_config
    as ``ssh -G`` sees it, under the inventory's values); `jump` names another inventory
    host or an OpenSSH ProxyJump list (``[user@]host[:port],...``)."""
    if spec.transport == "local":
        return LocalHost(spec)
    return SSHHost(spec, ssh_settings.resolve(spec, inventory))


def _hop_spec(settings: SSHSettings) -> HostSpec:
    """A HostSpec naming a jump hop (its connection comes from `settings`)."""
    return HostSpec(
        name=settings.name,
        hostname=settings.hostname,
        user=settings.user,
        port=settings.port,
        connect_timeout=settings.connect_timeout,
    )
