"""One interface over the machines dflash drives: SSH hosts (Fabric) and this machine
(the same command strings through ``bash -c``); argument lists are shell-quoted here."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.inventory import HostSpec
from orchestrator.transport import paramiko_login, ssh_settings

# Re-exported: part of a Host's interface.
from orchestrator.transport.host_errors import HostError as HostError
from orchestrator.transport.host_errors import last_line as last_line
from orchestrator.transport.ssh_settings import SSHSettings

# Large windows and packets keep one channel near line rate.
WINDOW_SIZE = 2 * 1024 * 1024
MAX_PACKET_SIZE = 256 * 1024

# sha256 of a file as 64 hex digits (sha256sum, else shasum); nothing if unreadable.
SHA256_FUNCTION = (
    'dflash_sha256() { { sha256sum || shasum -a 256; } < "$1" 2>/dev/null | cut -c1-64; }'
)


def quote(arg: str | os.PathLike) -> str:
    """Shell-quote one argument for a remote POSIX shell."""
    return shlex.quote(os.fspath(arg))


def command_line(command: str | Sequence[str]) -> str:
    if isinstance(command, str):
        return command
    return " ".join(quote(a) for a in command)


def upload_line(path: str, sha256: str, size: int, mode: int = 0o644) -> str:
    """The shell line `Host.put_bytes` runs: stdin into a hidden file, renamed to `path`
    only with `size` bytes and this sha256."""
    tmp = quote(f"{path}.partial-{os.getpid()}-{threading.get_ident()}")
    # noclobber: never reached through a planted link
    return (
        f"{SHA256_FUNCTION}; t={tmp}; trap 'rm -f \"$t\"' EXIT; trap 'exit 1' HUP INT TERM PIPE; "
        f'set -C; mkdir -p {quote(os.path.dirname(path) or ".")} && cat > "$t" && '
        f'n=$(wc -c < "$t") && if [ $n -ne {size} ]; then '
        f'echo "only $n of {size} bytes arrived" >&2; exit 1; '
        f'elif [ "$(dflash_sha256 "$t")" != {sha256} ]; then '
        "echo 'what arrived differs from what was sent (sha256)' >&2; exit 1; "
        f'else chmod {mode:o} "$t" && mv -f "$t" {quote(path)}; fi'
    )


@dataclass
class Result:
    stdout: str
    stderr: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Process:
    """A running command with binary pipes; stderr is collected, never left to block."""

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
    """A machine we run commands on."""

    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.name = spec.name
        self._home: str | None = None

    def run(
        self,
        command: str | Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> Result:
        """Run a command to completion (text output); `check`: non-zero exit is `HostError`."""
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
        raise NotImplementedError

    def put_bytes(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write `data` to `path` through a hidden file checked there and renamed into place."""
        proc = self.popen(upload_line(path, hashlib.sha256(data).hexdigest(), len(data), mode))
        try:
            proc.write(data)
        except OSError:
            pass  # its exit status and stderr say why
        proc.close_stdin()
        if proc.wait() != 0:
            raise HostError(
                f"{self.name}: could not write {path}: "
                f"{last_line(proc.stderr()) or 'the upload was cut'}; nothing was put there"
            )

    def has_file(self, path: str, sha256: str) -> bool:
        p = quote(path)
        line = f'{SHA256_FUNCTION}; [ -f {p} ] && [ "$(dflash_sha256 {p})" = {quote(sha256)} ]'
        return self.run(line, check=False, timeout=120).ok

    def get_bytes(self, path: str) -> bytes:
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
            # Part of every path sent back: it must be absolute and one line.
            if not home.startswith("/") or any(c in home for c in "\n\r\0"):
                raise HostError(
                    f"{self.name}: its $HOME is not an absolute path ({home[:80]!r}); "
                    "give the host an absolute workdir in the inventory"
                )
            self._home = home
        return self._home

    def expand(self, path: str) -> str:
        if path == "~":
            return self.home
        if path.startswith("~/"):
            return self.home.rstrip("/") + path[1:]
        return path

    def shell_word(self, path: str) -> str:
        """`path` as one shell word; a ``~/`` stays for the shell while home is unknown."""
        if self._home is None and path.startswith("~/") and len(path) > 2:
            return "~/" + quote(path[2:])
        return quote(self.expand(path))

    @property
    def workdir(self) -> str:
        return self.expand(self.spec.workdir)

    def connect(self) -> None:
        """Open the way to the host now rather than at the first command."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class PipeProcess(Process):
    """A local process with binary pipes, stderr in a file, in its own session."""

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
        self._proc.stdin.flush()  # a request/answer dialogue waits on it

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
    """A host reached through a Fabric `Connection` (lazily) under its `settings`."""

    def __init__(self, spec: HostSpec, settings: SSHSettings):
        super().__init__(spec)
        self.settings = settings
        self._jump = SSHHost(_hop_spec(settings.jump), settings.jump) if settings.jump else None
        self._conn = None
        self._lock = threading.Lock()

    @property
    def connection(self):
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            return self._conn

    def _connect(self):
        gateway = self._jump.connection if self._jump else self.settings.proxy_command_line()
        return paramiko_login.connect(self.settings, gateway, self.name, self.spec.connect_timeout)

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


def open_host(spec: HostSpec, inventory=None) -> Host:
    """A `Host` for an inventory entry, its SSH settings resolved once."""
    if spec.transport == "local":
        return LocalHost(spec)
    return SSHHost(spec, ssh_settings.resolve(spec, inventory))


def _hop_spec(settings: SSHSettings) -> HostSpec:
    return HostSpec(
        name=settings.name,
        hostname=settings.hostname,
        user=settings.user,
        port=settings.port,
        connect_timeout=settings.connect_timeout,
    )
