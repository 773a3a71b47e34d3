"""What OpenSSH makes of a host's configuration: ``ssh -G`` (without ssh, paramiko's
parser), as lower-case keyword -> values."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

from orchestrator.errors import DflashError
from orchestrator.transport.host_errors import last_line


class SSHConfigError(DflashError):
    """ssh_config or a jump target could not be resolved; the message says which and why."""


def config_file() -> str | None:
    """``-F`` for every ssh: None when ``$HOME`` is the account's home, else its config."""
    home = os.path.expanduser("~")
    try:
        account_home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        account_home = home
    if os.path.realpath(home) == os.path.realpath(account_home):
        return None
    path = os.path.join(home, ".ssh", "config")
    return path if os.path.isfile(path) else os.devnull


def query(
    alias: str, *, port: int | None = None, user: str | None = None, identity: str | None = None
) -> dict[str, list[str]]:
    """What ``ssh -G`` says for `alias`: lower-case keyword -> its values."""
    identity = identity and expand(identity)
    config = config_file()
    if alias.startswith("-"):
        raise SSHConfigError(f"host name {alias!r} starts with '-'; refusing it")
    if shutil.which("ssh") is None:
        return _paramiko_query(alias, port, user, identity)
    argv = ["ssh", "-G"]
    if config:
        argv += ["-F", config]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    if identity:
        argv += ["-i", identity.replace("%", "%%")]
    try:
        proc = subprocess.run(
            [*argv, "--", alias],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=15,
        )
    except subprocess.TimeoutExpired:
        raise SSHConfigError(f"'ssh -G {alias}' did not answer in 15 s") from None
    if proc.returncode != 0:
        raise SSHConfigError(
            f"{alias}: ssh cannot read its configuration: "
            f"{last_line(proc.stderr) or f'ssh -G exit {proc.returncode}'}"
        )
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key.lower(), []).append(value.strip())
    return out


def _paramiko_query(
    alias: str, port: int | None, user: str | None, identity: str | None
) -> dict[str, list[str]]:
    """The same answer from paramiko's parser, without an ssh client."""
    import paramiko

    path = config_file() or os.path.expanduser("~/.ssh/config")
    config = paramiko.SSHConfig.from_path(path) if os.path.isfile(path) else paramiko.SSHConfig()
    found = config.lookup(alias)
    out: dict[str, list[str]] = {
        k: (v if isinstance(v, list) else [str(v)]) for k, v in found.items()
    }
    if port:
        out["port"] = [str(port)]
    if user:
        out["user"] = [user]
    keys = out.get("identityfile") or [f"~/.ssh/id_{k}" for k in ("rsa", "ecdsa", "ed25519")]
    out["identityfile"] = ([identity] if identity else []) + keys
    out.setdefault("userknownhostsfile", ["~/.ssh/known_hosts ~/.ssh/known_hosts2"])
    out.setdefault("globalknownhostsfile", ["/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"])
    return out


def expand(path: str) -> str:
    """`path` with ``~`` expanded, absolute."""
    return os.path.abspath(os.path.expanduser(path))
