"""How to reach a host over SSH, resolved ONCE by ``ssh -G`` under the inventory's values,
for both stacks (docs/ssh-and-security.md)."""

from __future__ import annotations

import getpass
import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.transport.ssh_config import SSHConfigError, config_file, expand, query

if TYPE_CHECKING:
    from orchestrator.inventory import HostSpec, Inventory

MAX_HOPS = 8  # deeper is a jump loop
# Keepalives that end a connection whose host died.
ALIVE_INTERVAL = 15
ALIVE_COUNT = 4


@dataclass(frozen=True)
class SSHSettings:
    """Everything needed to open one SSH connection, as OpenSSH resolved it."""

    name: str  # the inventory host or jump target
    alias: str  # looked up in ssh_config and given to ssh
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    identity_agent: str | None
    proxy_command: str | None
    jump: SSHSettings | None  # the hop before this host
    user_known_hosts: tuple[str, ...]  # the inventory's first: new keys go there
    global_known_hosts: tuple[str, ...]
    accept_new: bool
    connect_timeout: float
    config_file: str | None  # -F for every ssh
    # (ControlPath, ControlPersist) of ssh_config's persisted master
    shared_master: tuple[str, str] | None = None

    @property
    def known_hosts(self) -> tuple[str, ...]:
        return self.user_known_hosts + self.global_known_hosts

    @property
    def address(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    def openssh_options(self, ciphers: str = "") -> list[str]:
        """``ssh`` options (no destination), every value explicit: ssh reads nothing else."""
        opts = ["-F", self.config_file] if self.config_file else []
        opts += [
            "-T",
            "-x",
            "-a",
            "-o",
            "BatchMode=yes",
            "-o",
            "Compression=no",
            "-o",
            "ClearAllForwardings=yes",
            "-o",
            f"StrictHostKeyChecking={'accept-new' if self.accept_new else 'yes'}",
            "-o",
            "UserKnownHostsFile=" + _config_list(self.user_known_hosts),
            "-o",
            "GlobalKnownHostsFile=" + _config_list(self.global_known_hosts),
            "-o",
            f"ConnectTimeout={max(1, int(round(self.connect_timeout)))}",
            "-o",
            f"ServerAliveInterval={ALIVE_INTERVAL}",
            "-o",
            f"ServerAliveCountMax={ALIVE_COUNT}",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "HostName=" + _config_value(self.hostname),
            "-p",
            str(self.port),
            "-l",
            self.user,
            "-o",
            f"IdentitiesOnly={'yes' if self.identities_only else 'no'}",
            "-o",
            "IdentityAgent="
            + (_config_value(self.identity_agent) if self.identity_agent else "none"),
        ]
        if ciphers:
            opts += ["-c", ciphers]
        for key in self.identity_files:
            opts += ["-i", key.replace("%", "%%")]
        if self.jump is not None:
            # Each hop with its own settings; ssh runs it through a shell after %-expansion.
            inner = ["ssh", *self.jump.openssh_options(ciphers), "-W", "%h:%p", self.jump.alias]
            line = " ".join(shlex.quote(a) for a in inner)
            line = line.replace("%", "%%").replace("%%h:%%p", "%h:%p")
            opts += ["-o", f"ProxyCommand={line}"]
        elif self.proxy_command:
            opts += ["-o", f"ProxyCommand={self.proxy_command}"]
        else:
            opts += ["-o", "ProxyJump=none"]
        return opts

    def paramiko_kwargs(self) -> dict:
        """Fabric's ``connect_kwargs``: the settings' keys and agent only."""
        return {
            "key_filename": list(self.identity_files),
            "look_for_keys": False,
            "allow_agent": self.identity_agent is not None,
            "banner_timeout": self.connect_timeout,
            "auth_timeout": self.connect_timeout,
        }

    def proxy_command_line(self) -> str | None:
        """ssh_config's ProxyCommand with its %-tokens expanded, for paramiko."""
        if self.jump is not None or not self.proxy_command:
            return None
        tokens = {
            "h": self.hostname,
            "p": str(self.port),
            "r": self.user,
            "n": self.alias,
            "%": "%",
        }
        out, i, cmd = [], 0, self.proxy_command
        while i < len(cmd):
            if cmd[i] == "%" and i + 1 < len(cmd) and cmd[i + 1] in tokens:
                out.append(tokens[cmd[i + 1]])
                i += 2
            else:
                out.append(cmd[i])
                i += 1
        return "".join(out)


def resolve(spec: HostSpec, inventory: Inventory | None = None) -> SSHSettings:
    """The settings that reach inventory host `spec` (its values over ``ssh -G``)."""
    return _resolve(spec, inventory, 0)


def _resolve(spec: HostSpec, inventory: Inventory | None, depth: int) -> SSHSettings:
    if depth > MAX_HOPS:
        raise SSHConfigError(
            f"{spec.name}: more than {MAX_HOPS} jump hosts in a row; is "
            "there a ProxyJump loop in ~/.ssh/config or the inventory?"
        )
    alias = spec.hostname or spec.name
    conf = query(alias, port=spec.port, user=spec.user, identity=spec.identity_file)
    jump = None
    proxy_command = None
    if spec.jump:
        if inventory is not None and spec.jump in inventory.hosts:
            jump = _resolve(inventory.hosts[spec.jump], inventory, depth + 1)
        else:
            jump = _hops(spec.jump, spec, depth)
    else:
        proxy_jump = _first(conf, "proxyjump")
        proxy_command = _first(conf, "proxycommand")
        if proxy_command and proxy_command.lower() == "none":
            proxy_command = None
        if proxy_jump and proxy_jump.lower() != "none" and not proxy_command:
            jump = _hops(proxy_jump, spec, depth)
    return _settings(spec.name, alias, conf, spec, jump, proxy_command)


def _hops(chain: str, base: HostSpec, depth: int) -> SSHSettings:
    """The last hop of a ProxyJump list, each through the one before, inheriting `base`'s key,
    known_hosts, policy and timeout."""
    from orchestrator.inventory import HostSpec

    jump = None
    for target in [t.strip() for t in chain.split(",") if t.strip()]:
        if target.startswith("ssh://"):
            target = target[len("ssh://") :]
        user, _, hostport = target.rpartition("@")
        host, port = hostport, None
        if hostport.count(":") == 1:
            host, _, port_text = hostport.partition(":")
            if not port_text.isdigit():
                raise SSHConfigError(
                    f"{base.name}: jump host {target!r}: port {port_text!r} is not a number"
                )
            port = int(port_text)
        hop = HostSpec(
            name=target,
            hostname=host,
            user=user or None,
            port=port,
            identity_file=base.identity_file,
            known_hosts=base.known_hosts,
            accept_new_host_key=base.accept_new_host_key,
            connect_timeout=base.connect_timeout,
        )
        if jump is None:
            jump = _resolve(hop, None, depth + 1)
        else:
            conf = query(host, port=port, user=user or None, identity=base.identity_file)
            jump = _settings(target, host, conf, hop, jump, None)
    if jump is None:
        raise SSHConfigError(f"{base.name}: empty jump host list {chain!r}")
    return jump


def _settings(
    name: str,
    alias: str,
    conf: dict[str, list[str]],
    spec: HostSpec,
    jump: SSHSettings | None,
    proxy_command: str | None,
) -> SSHSettings:
    identities = []
    for entry in conf.get("identityfile", []):
        path = expand(entry)
        if os.path.isfile(path) and path not in identities:
            identities.append(path)
    user_known = [expand(spec.known_hosts)] if spec.known_hosts else []
    _carried(name, "the inventory's known_hosts", user_known)
    ssh_known = [expand(e) for e in _words(conf, "userknownhostsfile")]
    _carried(name, "ssh_config's UserKnownHostsFile", ssh_known)
    user_known += [p for p in dict.fromkeys(ssh_known) if p not in user_known]
    global_known = [expand(e) for e in _words(conf, "globalknownhostsfile")]
    _carried(name, "ssh_config's GlobalKnownHostsFile", global_known)
    agent = _first(conf, "identityagent")
    if agent is None or agent == "SSH_AUTH_SOCK":
        agent = os.environ.get("SSH_AUTH_SOCK") or None
    elif agent.lower() == "none":
        agent = None
    elif agent.startswith("$"):
        agent = os.environ.get(agent[1:].strip("{}")) or None
    else:
        agent = expand(agent)
    _carried(name, "the IdentityAgent", [agent] if agent else [])
    hostname = _first(conf, "hostname") or alias
    _carried(name, "the hostname", [hostname])
    try:
        port = int(_first(conf, "port") or 22)
    except ValueError:
        raise SSHConfigError(
            f"{name}: ssh_config gives port {_first(conf, 'port')!r}, not a number"
        ) from None
    return SSHSettings(
        name=name,
        alias=alias,
        hostname=hostname,
        port=port,
        user=_first(conf, "user") or getpass.getuser(),
        identity_files=tuple(identities),
        identities_only=(_first(conf, "identitiesonly") or "no").lower() == "yes",
        identity_agent=agent,
        proxy_command=proxy_command,
        jump=jump,
        user_known_hosts=tuple(user_known),
        global_known_hosts=tuple(global_known),
        accept_new=spec.accept_new_host_key,
        connect_timeout=spec.connect_timeout,
        config_file=config_file(),
        shared_master=_shared_master(conf),
    )


def _shared_master(conf: dict[str, list[str]]) -> tuple[str, str] | None:
    """(ControlPath, ControlPersist) of ssh_config's persisted, shared master, or None."""
    master = (_first(conf, "controlmaster") or "").lower()
    path = _first(conf, "controlpath") or ""
    persist = (_first(conf, "controlpersist") or "no").lower()
    if master not in ("auto", "autoask") or path.lower() in ("", "none"):
        return None
    if persist in ("no", "false", "0") or "%" in path:  # %: not expanded (no ssh -G)
        return None
    return expand(path), "yes" if persist == "true" else persist


def _first(conf: dict[str, list[str]], key: str) -> str | None:
    values = conf.get(key)
    return values[0] if values else None


def _words(conf: dict[str, list[str]], key: str) -> list[str]:
    # space-separated and unquoted; "none" means no file.
    return [w for value in conf.get(key, []) for w in value.split() if w.lower() != "none"]


def _config_value(value: str) -> str:
    # '%' would be a token there.
    return '"' + value.replace("%", "%%") + '"'


# What a double-quoted value cannot hold: '"', or a backslash OpenSSH 8.7+ reads as escape.
_UNCARRIED = re.compile(r'"|\\(?=["\'\\]|$)')


def _carried(name: str, setting: str, values: list[str]) -> None:
    """Refuse, naming host and setting, a value ``ssh`` could not get intact."""
    for value in values:
        found = _UNCARRIED.search(value)
        if found:
            what = (
                "a '\"'" if found.group() == '"' else "a backslash that OpenSSH reads as an escape"
            )
            raise SSHConfigError(
                f"{name}: {setting} {value!r} holds {what}, which OpenSSH's options "
                f"cannot carry; rename or move it, or point {setting} elsewhere"
            )


def _config_list(paths: tuple[str, ...]) -> str:
    return " ".join(_config_value(p) for p in paths) if paths else "none"
