"""One OpenSSH master connection per host (docs/relay.md, "Connection reuse")."""

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
    """In a master's ssh: SIGTERM when its starter thread ends (PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None

    def tie() -> None:  # this runs in a forked child: no locks
        prctl(1, 15)
        if os.getppid() != parent:
            os._exit(0)

    return tie


_SUN_PATH_MAX = 104  # a unix socket's path, its NUL included
_DIR_PREFIX = "dfr-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale_dirs(base: str | None = None) -> list[str]:
    """Remove the socket folders of dead relays (killed with -9); returns them."""
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
    """One OpenSSH master per host, private (a 0700 folder) or one ssh_config persists."""

    def __init__(self, inventory: Inventory | None):
        self.inventory = inventory
        reap_stale_dirs()
        self.dir: str | None = None
        self.masters: dict[str, subprocess.Popen | None] = {}
        self.paths: dict[int, str] = {}
        self.shared: set[str] = set()
        self._lock = threading.Lock()

    def options(self, host: Host) -> list[str]:
        """What an ``ssh`` to `host` adds for its master, if up."""
        path = self.paths.get(id(host))
        if path is None:
            return []
        if path in self.shared:
            # auto: a master that died since is replaced by this ssh
            persist = host.settings.shared_master[1]
            return [*_control(path, "auto"), "-o", f"ControlPersist={persist}"]
        proc = self.masters[path]
        if not os.path.exists(path) or proc is None or proc.poll() is not None:
            # not up: connect on its own, whatever ssh_config says
            return ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        return _control(path, "no")

    def wait(self, host: Host) -> None:
        """Wait until `host`'s master is up, gone, or past its connect timeout."""
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
        """Start the masters for `hosts`, from the thread that lives as long as the relay."""
        hosts = tuple(h for h in hosts if not isinstance(h, LocalHost))
        configured = [h.settings.shared_master for h in hosts]
        paths = [c[0] for c in configured if c]
        for host, shared in zip(hosts, configured, strict=True):
            usable = (
                shared is not None
                and paths.count(shared[0]) == 1  # two hosts, one socket: keep them apart
                and os.path.isdir(os.path.dirname(shared[0]))
                # ssh binds the path with a random suffix first; too long fails the connection
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
            self.masters[path] = None
            return
        self._spawn(
            host, path, [*_control(path, "auto"), "-o", f"ControlPersist={persist}"], tied=False
        )

    def _start_private(self, host: Host) -> None:
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
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
        """End the private masters; a shared one stays, as its ControlPersist says."""
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
    return ["-o", f"ControlMaster={master}", "-o", "ControlPath=" + path.replace("%", "%%")]
