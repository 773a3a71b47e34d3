"""Real OpenSSH servers on loopback: generated keys, random ports, own folders."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def account_home() -> Path:
    """The account's home as sshd gives it to sessions; CI's clean $HOME differs."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def clear_stale_pyenv_lock(min_age: float = 2.0) -> bool:
    """Remove pyenv's rehash lock a killed SSH session left (docs/development.md)."""
    root = Path(os.environ.get("PYENV_ROOT", account_home() / ".pyenv"))
    lock = root / "shims" / ".pyenv-shim"
    try:
        if time.time() - lock.stat().st_mtime >= min_age:
            lock.unlink()
            return True
    except FileNotFoundError:
        pass
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


@dataclass
class SSHServer:
    name: str
    port: int
    root: Path  # the host's workdir, checkpoints and models
    host_key: Path
    proc: subprocess.Popen

    @classmethod
    def start(
        cls, base: Path, name: str, authorized_keys: Path, extra_config: tuple[str, ...] = ()
    ) -> SSHServer:
        conf_dir = base / f"sshd-{name}"
        conf_dir.mkdir(parents=True)
        root = base / name
        root.mkdir()
        host_key = keygen(conf_dir / "host_key")
        port = free_port()
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        config = conf_dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"PidFile {conf_dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {authorized_keys}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "AllowTcpForwarding yes",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                    *extra_config,
                    "",
                ]
            )
        )
        log = open(conf_dir / "sshd.log", "wb")
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        server = cls(name=name, port=port, root=root, host_key=host_key, proc=proc)
        server.wait_ready()
        return server

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd {self.name} exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd {self.name} did not answer on port {self.port}")

    def known_hosts_line(self) -> str:
        kind, b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {b64}\n"

    def sessions(self) -> list[psutil.Process]:
        """The per-connection sshd processes and their children."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill_sessions(self) -> int:
        """Kill every connection this server is serving (the listener stays up)."""
        victims = self.sessions()
        for p in victims:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=5)
        clear_stale_pyenv_lock(min_age=0)
        return len(victims)

    def stop(self) -> None:
        self.kill_sessions()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sshd(ssh_base: Path, name: str, extra_config: tuple[str, ...] = ()) -> SSHServer:
    """Start a server accepting ``ssh_base``'s user key, its host key in known_hosts."""
    server = SSHServer.start(ssh_base, name, ssh_base / "authorized_keys", extra_config)
    known = ssh_base / "known_hosts"
    # A line for this port is an earlier server's, since stopped: its key would read as changed.
    port = f"]:{server.port}"
    lines = known.read_text().splitlines(keepends=True) if known.exists() else []
    kept = [ln for ln in lines if not any(h.endswith(port) for h in ln.split(" ")[0].split(","))]
    known.write_text("".join(kept) + server.known_hosts_line())
    return server


def ssh_host_entry(server: SSHServer, ssh_base: Path, **extra) -> dict:
    """An inventory host entry for a loopback sshd server, updated with `extra`."""
    entry = {
        "transport": "ssh",
        "hostname": "127.0.0.1",
        "port": server.port,
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "identity_file": str(ssh_base / "id_test"),
        "known_hosts": str(ssh_base / "known_hosts"),
        "python": sys.executable,
        "workdir": str(server.root / "dflash"),
        "connect_timeout": 5,
    }
    entry.update(extra)
    return entry
