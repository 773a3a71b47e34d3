"""One OpenSSH master connection per host (`Multiplexer`), shared by the commands and streams
that reach it through ``ssh``: a channel each, not a TCP connection, key exchange and
login.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from orchestrator.inventory import Inventory
from orchestrator.transport.hosts import Host, LocalHost
from orchestrator.transport.openssh import openssh_options


def _tied_to(parent: int) -> Callable[[], None] | None:
    """What a private master's ssh runs between fork and exec so that it gets SIGTERM when
    the thread that started it (the relay's main thread) ends, even by kill -9 (Linux's
    PR_SET_PDEATHSIG, kept across exec): a relay never leaves a master holding a session
    on its host. None elsewhere: the ssh simply runs (`Multiplexer.close` still ends it).
    In the child, not through a python wrapper: that cost an interpreter start (a tenth
    of a second here) before every login."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None

    def tie() -> None:  # only calls that take no lock: this runs in a forked child
        prctl(1, 15)  # 1: PR_SET_PDEATHSIG, 15: SIGTERM
        if os.getppid() != parent:
            os._exit(0)  # the parent died before prctl: nobody to serve

    return tie


_SUN_PATH_MAX = 104  # a unix socket's path, bytes with its NUL (108 on Linux, 104 on BSDs)
_DIR_PREFIX = "dfr-"  # + owner pid + "-": short, unix socket paths are limited


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale_dirs(base: str | None = None) -> list[str]:
    """Remove the socket folders of earlier relays whose process is gone (killed with -9:
    nothing of theirs could clean up); returns the folders removed."""
    base = base or tempfile.gettempdir()
    gone = []
    try:
        names = os.listdir(base)
    except OSError:
        return gone
    for name in names:
        m = re.fullmatch(re.escape(_DIR_PREFIX) + r"(\d+)-\w+", name)
        path = os.path.join(base, name)
        try:
            mine = os.lstat(path).st_uid == os.getuid()
        except OSError:
            continue
        if m and mine and not os.path.islink(path) and not _pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


class Multiplexer:
    """One OpenSSH master connection per host for the relay's commands and streams.

    A stream then costs a channel, not a TCP connection, key exchange and authentication.
    When a master is not (or no longer) there, ssh quietly makes its own connection, so
    the master only ever saves time.

    Two kinds of master:

    - **private** (the default): started by this relay on a socket in a folder of its own
      (mode 0700), ``ControlPersist=no``. Masters end with `close`, and on Linux also when
      this process dies without closing (a master gets SIGTERM from the kernel then, see
      `_tied_to`); the socket folder of a relay killed that way is removed by the
      next relay (`reap_stale_dirs`). Every relay pays one login per host.
    - **shared**: where the user's ssh_config asks for a persisted master for the host
      (ControlMaster auto, ControlPath, ControlPersist; see `SSHSettings.shared_master`),
      the relay uses the one at that path, as the user's own ``ssh`` would, and starts it
      there when it is not up (it then persists as configured). A relay soon after another
      (or after the user's own ``ssh``) then logs in nowhere. The host key was checked by
      whoever started that master, under their settings; this relay's own logins keep its
      policy. Two hosts whose configured paths coincide (a ControlPath without %C or
      %h/%p/%r) get private masters; so does a path whose folder does not exist or that
      is too long for a socket.
    """

    def __init__(self, inventory: Inventory | None):
        self.inventory = inventory
        reap_stale_dirs()
        self.dir: str | None = None  # the private sockets' folder, made on first need
        self.masters: dict[str, subprocess.Popen | None] = {}  # path -> the ssh we started
        self.paths: dict[int, str] = {}
        self.shared: set[str] = set()  # paths of configured, persisted masters
        self._lock = threading.Lock()

    def options(self, host: Host) -> list[str]:
        """What an ``ssh`` to `host` adds: its master's socket, or (a private master not
        up) no master at all."""
        path = self.paths.get(id(host))
        if path is None:
            return []
        if path in self.shared:
            # auto: a master that died since (a stale socket) is replaced by this ssh
            persist = host.settings.shared_master[1]
            return [*_control(path, "auto"), "-o", f"ControlPersist={persist}"]
        proc = self.masters[path]
        if not os.path.exists(path) or proc is None or proc.poll() is not None:
            # not up: this stream connects on its own, whatever ssh_config says of masters
            return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        return _control(path, "no")

    def wait(self, host: Host) -> None:
        """Wait until `host`'s master is up (its socket is there), gone, or past its
        connect timeout; a command started then shares it instead of connecting anew."""
        path = self.paths.get(id(host))
        if path is None:
            return
        proc = self.masters[path]
        deadline = time.monotonic() + host.settings.connect_timeout + 5
        while (
            not os.path.exists(path)
            and proc is not None
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.005)

    def start(self, *hosts: Host) -> None:
        """Start the masters for `hosts` in the background (none for a host whose shared
        master is up already); commands and streams use each once it is up. Call it from
        the thread that lives as long as the relay: a private master ends with it."""
        hosts = tuple(h for h in hosts if not isinstance(h, LocalHost))
        configured = [h.settings.shared_master for h in hosts]
        paths = [c[0] for c in configured if c]
        for host, shared in zip(hosts, configured, strict=True):
            usable = (
                shared is not None
                and paths.count(shared[0]) == 1  # two hosts, one socket: keep them apart
                and os.path.isdir(os.path.dirname(shared[0]))
                # ssh binds "PATH.<16 random>" first; longer than a socket address can
                # be, it fails the whole connection, not just the sharing
                and len(os.fsencode(shared[0])) + 17 < _SUN_PATH_MAX
            )
            with self._lock:
                if usable:
                    self._start_shared(host, *shared)
                else:
                    self._start_private(host)

    def _start_shared(self, host: Host, path: str, persist: str) -> None:
        self.shared.add(path)
        self.paths[id(host)] = path
        if os.path.exists(path):
            self.masters[path] = None  # up already (a dead one: the first ssh replaces it)
            return
        # -N with ControlPersist: ssh forks once logged in, its first process exits and
        # the master stays for the next relay; where another master came up meanwhile,
        # this ssh exits at once.
        self._spawn(
            host, path, [*_control(path, "auto"), "-o", f"ControlPersist={persist}"], tied=False
        )

    def _start_private(self, host: Host) -> None:
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")  # mode 0700
        path = os.path.join(self.dir, str(len(self.masters)))
        self.paths[id(host)] = path
        self._spawn(
            host, path, ["-M", *_control(path, "yes"), "-o", "ControlPersist=no"], tied=True
        )

    def _spawn(self, host: Host, path: str, extra: list[str], tied: bool) -> None:
        argv = ["ssh", *openssh_options(host), "-N", *extra, host.settings.alias]
        self.masters[path] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_tied_to(os.getpid()) if tied else None,
        )

    def close(self) -> None:
        """End the private masters; a shared master stays, as its ControlPersist says
        (only a starter still logging in is ended)."""
        procs = [p for p in self.masters.values() if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def _control(path: str, master: str) -> list[str]:
    """``ssh`` options for the master socket at `path` (``%`` is a token there)."""
    return ["-o", f"ControlMaster={master}", "-o", "ControlPath=" + path.replace("%", "%%")]
