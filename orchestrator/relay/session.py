"""The hosts of one relay: where it reads and writes, the connections, and the locks.

`Session` resolves the folders (flags, else the inventory's trainer and eval roles),
connects to the source and every destination, and, all at once: judges the source's
checkpoints (`orchestrator.relay.checkpoints.judge_complete`) and takes each
destination's relay lock, scanning it under the lock. It holds those connections,
locks and the ssh masters of the streams until `close` (or the end of its ``with``).
`hash_all` is the one round of hashing that planning needs (``--verify`` only).

A destination's lock holder also serves the relay's other questions for that folder on
its open channel (`ask`: hash, publish, scan; see ``remote.relay.lock.serve``) and
receives the transfer's first batch there (`receivers`), so a destination costs one SSH
session, shell and interpreter per relay, not one per step.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from orchestrator.inventory import HostSpec, Inventory, TrainerRole
from orchestrator.relay.checkpoints import Scan, judge_complete, parse_scan, scan
from orchestrator.relay.holder import LockHolder
from orchestrator.relay.options import RELAY_PYTHON_FLAGS, RelayOptions
from orchestrator.relay.plan import Dest, Draft, HashKey
from orchestrator.relay.report import RelayError
from orchestrator.relay.stream import Stream
from orchestrator.sizes import parse_size
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, Result, open_host
from orchestrator.transport.master import Multiplexer
from orchestrator.transport.openssh import connection_error, local_ciphers
from orchestrator.transport.openssh_host import control_host


def parallel(calls: list) -> list:
    """Run zero-argument callables in threads; results in order; first error re-raised."""
    if len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def hash_many(host: Host, requests: list[dict] | tuple[dict, ...]) -> dict[HashKey, dict]:
    """sha256 of files or prefixes on a host, one remote call: {(path, length): result}."""
    if not requests:
        return {}
    result = bundle.run_remote(
        host,
        ["relay-hash"],
        stdin=json.dumps(list(requests)).encode(),
        python_flags=RELAY_PYTHON_FLAGS,
    )
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        (req["path"], req.get("length")): ans for req, ans in zip(requests, answers, strict=False)
    }


def _src_dir(spec: HostSpec, opts: RelayOptions) -> str:
    if opts.src_dir:
        return opts.src_dir
    if spec.trainer is None:
        raise RelayError(
            f"{spec.name} has no trainer role; add 'roles: {{trainer: "
            "{checkpoints: DIR}}' to it in the inventory or pass --src-dir"
        )
    return spec.trainer.checkpoints


def _dest_dir(spec: HostSpec, opts: RelayOptions) -> str:
    if opts.dest_dir:
        return opts.dest_dir
    if spec.eval is None:
        raise RelayError(
            f"{spec.name} has no eval role; add 'roles: {{eval: {{drafters: "
            "DIR}}}' to it in the inventory or pass --dest-dir"
        )
    return spec.eval.drafters


def _reserve(spec: HostSpec, opts: RelayOptions) -> int:
    if opts.reserve is not None:
        return opts.reserve
    if spec.eval is not None and spec.eval.reserve is not None:
        return parse_size(spec.eval.reserve)
    return 0


def _expand(host: Host, folder: str) -> str:
    return host.expand(folder).rstrip("/") or "/"


class Session:
    """Connected and locked hosts of one relay (module docstring); use it with ``with``.

    `lock`: take the destinations' relay locks (else only scan them, as ``--dry-run``
    does). `mux`: start an ssh master per host for the commands and streams to share.
    `ahead` (with `mux`): start the first batch's ``relay-send`` while the hosts are
    scanned (`spares`, by host name; its ready frame carries the source's scan), so the
    bytes can flow as soon as the plan is made; the transfer uses it once it says it
    runs, and `close` ends it when not needed. A destination's first receiver is its
    lock holder (`receivers`, `orchestrator.relay.holder`): one command per host.
    """

    def __init__(
        self,
        inventory: Inventory,
        source: str,
        destinations: list[str],
        options: RelayOptions,
        *,
        lock: bool = True,
        mux: bool = False,
        ahead: bool = False,
    ):
        self.inv = inventory
        self.opts = options
        self.src_spec = inventory.host(source)
        dest_specs = inventory.expand(destinations)
        if not dest_specs:
            raise RelayError(
                "no destination: pass --to HOST[,HOST...] or set defaults.relay_to in the inventory"
            )
        if any(d.name == self.src_spec.name for d in dest_specs):
            raise RelayError(f"{source} is both the source and a destination; pick another --to")
        src_cfg = _src_dir(self.src_spec, options)
        dest_cfg = [(spec, _dest_dir(spec, options)) for spec in dest_specs]
        self.src: Host | None = None
        self.src_dir = src_cfg
        self.src_scan: Scan | None = None
        self.hosts: dict[str, Host] = {}  # destination name -> its connection
        self.dests: list[Dest] = []
        self.mux: Multiplexer | None = None
        self._locks: list[LockHolder] = []  # every relay-lock started, to end at `close`
        # destination -> its lock holder: answers questions, receives the first batch
        self.receivers: dict[str, LockHolder] = {}
        self._guard = threading.Lock()
        self.spares: dict[str, Stream] = {}
        self._ahead = ahead and mux
        opened: list[Host] = []
        try:
            if mux:
                self.mux = Multiplexer(inventory)
            # Every command goes through OpenSSH and the host's master (one connection per
            # host, shared with the streams; see orchestrator.transport.openssh_host). Each
            # host's settings come from an `ssh -G` of its own: all at once.
            # The local client's ciphers (``ssh -Q cipher``, every ssh line offers them) are
            # asked beside those, not after them on the way to the masters.
            specs = [self.src_spec, *(spec for spec, _ in dest_cfg)]
            *now, _ = parallel(
                [lambda s=s: control_host(open_host(s, inventory), self.mux) for s in specs]
                + [local_ciphers]
            )
            opened += now
            self.src = opened[0]
            if self.mux is not None:
                self.mux.start(*opened)
            dest_hosts = opened[1:]
            results = parallel(
                [lambda: self._look(src_cfg)]
                + [
                    lambda h=h, d=d: self._open_dest(h, d, lock)
                    for h, (_, d) in zip(dest_hosts, dest_cfg, strict=False)
                ]
            )
            self.src_dir, self.src_scan = results[0]
            self.hosts = {h.name: h for h in dest_hosts}
            self.dests = [
                Dest(h.name, root, sc, _reserve(spec, options))
                for h, (root, sc), (spec, _) in zip(dest_hosts, results[1:], dest_cfg, strict=False)
            ]
        except BaseException:
            self._close(opened)
            raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def roots(self) -> dict[str, str]:
        """Destination host -> its drafters folder."""
        return {d.name: d.root for d in self.dests}

    @property
    def where(self) -> str:
        """The source folder as ``host:dir``, for messages."""
        return f"{self.src.name}:{self.src_dir}"

    def _look(self, folder: str) -> tuple[str, Scan]:
        """Expand the source folder on its host and judge its checkpoints there: with the
        scan in the ready frame of the ``relay-send`` started ahead (one command on the
        source), else (no spare, or it failed to start) by a ``relay-scan`` of its own."""
        src_dir = _expand(self.src, folder)
        spare = self._spare(self.src, ["relay-send"], ("--scan", src_dir))
        first = None
        if spare is not None and spare.wait_ready():
            bundle.seen(self.src)  # it answered: later commands there need no bundle check
            try:
                first = parse_scan(src_dir, json.loads(spare.hello), self.src.name)
            except ValueError:
                first = None  # not JSON: ask again the usual way (which says what is wrong)
        role = self.src_spec.trainer or TrainerRole(checkpoints=src_dir)
        return src_dir, judge_complete(self.src, src_dir, role, first=first)

    def _open_dest(self, host: Host, folder: str, lock: bool) -> tuple[str, Scan]:
        # No relay-recv started ahead: the lock holder receives the first batch itself.
        root = _expand(host, folder)
        return root, self._lock_root(host, root) if lock else scan(host, root)

    def _spare(self, host: Host, argv: list[str], extra: tuple[str, ...] = ()) -> Stream | None:
        """Start `argv` (with `extra` arguments for its start only) on `host` ahead of
        need (see the class docstring); the stream, or None when not started. Its line is
        guarded like every first command: without the bundle it ends before its ready
        signal, and the transfer starts a new one."""
        if not self._ahead:
            return None
        line, _ = bundle.first_line(host, [*argv, *extra], RELAY_PYTHON_FLAGS)
        s = Stream(host, line, self.inv, stdin=True, stdout=True, mux=self.mux)
        s.argv = argv  # what the transfer may use it for
        with self._guard:
            self.spares[host.name] = s
        return s

    def _start_lock(self, host: Host, argv: list[str], root: str) -> tuple[LockHolder, dict | None]:
        """Start ``relay-lock`` (pushing the bundle first only where it is missing: no
        separate check); (holder, its first answer or None when it gave none)."""
        line, guarded = bundle.first_line(host, argv, RELAY_PYTHON_FLAGS)
        holder = LockHolder(host, line, self.inv, mux=self.mux, root=root)
        with self._guard:
            self._locks.append(holder)
        answer = holder.first()
        if answer is not None:
            bundle.seen(host)  # it answered: the streams there need no bundle check
            return holder, answer
        code, _, err = holder.finish()
        if code == 255:  # ssh could not reach the host (a refused host key among others)
            raise connection_error(host, err)
        if guarded and bundle.was_missing(host, code, err):
            bundle.ensure(host)  # pushed now: the retry is not guarded
            return self._start_lock(host, argv, root)
        bundle.check_result(host, Result("", err, code), ["relay-lock"])
        return holder, None

    def _lock_root(self, host: Host, root: str) -> Scan:
        """Take `root`'s relay lock on `host` (held until `close`) and scan it under the lock.

        Two relays writing into one drafters folder would share its partial folders; the
        second is refused with who holds the lock. The lock lives in a host-side process
        fed by this connection, so it ends with this relay, however that ends.
        """
        try:
            user = getpass.getuser()
        except (OSError, KeyError):  # no login name in this environment
            user = "?"
        by = f"{user}@{socket.gethostname()} pid {os.getpid()}"
        argv = ["relay-lock", f"--by={by}", f"--wait={self.opts.lock_wait}"]
        holder, data = self._start_lock(
            host, [*argv, f"--patience={self.opts.patience:g}", "--", root], root
        )
        if not isinstance(data, dict):
            raise RelayError(f"{host.name}: no answer from relay-lock for {root}")
        if not data.get("locked"):
            holder = data.get("holder") or {}
            since = holder.get("since")
            when = (
                f", since {_dt.datetime.fromtimestamp(since).strftime('%H:%M:%S')}"
                if isinstance(since, (int, float))
                else ""
            )
            raise RelayError(
                f"another dflash relay is writing to {host.name}:{root} "
                f"({holder.get('by') or 'unknown'}{when}); let it finish, "
                "then run this again"
            )
        found = parse_scan(root, data.get("scan"), host.name)
        holder.keep_alive(self.opts.patience / 4)  # its patience with us never runs out
        with self._guard:
            self.receivers[host.name] = holder
        return found

    def ask(self, dest: str, request: dict) -> dict:
        """One request to destination `dest`'s lock holder (``remote.relay.lock.serve``),
        its answer; an ``error`` answer, a lost channel or a non-object answer raise
        `RelayError` naming the host (`LockHolder.ask`)."""
        return self.receivers[dest].ask(request)

    def hash_all(self, dr: Draft) -> dict[str, dict[HashKey, dict]]:
        """Ask every destination for the hashes `dr` needs, all at once; answers by name."""
        names = [n for n, reqs in dr.dest_requests.items() if reqs]
        answers = parallel([lambda n=n: self._hash(n, dr.dest_requests[n]) for n in names])
        return dict(zip(names, answers, strict=True))

    def _hash(self, dest: str, requests: tuple[dict, ...]) -> dict[HashKey, dict]:
        if dest not in self.receivers:  # not locked (a dry run): a command of its own
            return hash_many(self.hosts[dest], requests)
        answers = self.ask(dest, {"op": "hash", "requests": list(requests)}).get("hashes")
        if not isinstance(answers, list) or len(answers) != len(requests):
            raise RelayError(f"{dest}: malformed answer to a hash request")
        return {
            (req["path"], req.get("length")): ans if isinstance(ans, dict) else {}
            for req, ans in zip(requests, answers, strict=True)
        }

    def close(self) -> None:
        """Drop the locks, stop the ssh masters, close the connections."""
        self._close([self.src, *self.hosts.values()])

    def _close(self, hosts: list[Host | None]) -> None:
        with self._guard:
            spares, self.spares = list(self.spares.values()), {}
        for s in spares:
            # EOF, then the local ssh ends: the host-side command ends by itself when it
            # reads that EOF (no signal reaches it mid-login), and nobody waits for it.
            s.close_stdin()
            s.kill()
            s.finish()
        for holder in self._locks:  # EOF ends the host-side holder, which drops the lock
            try:
                holder.finish()
            except Exception:
                pass
            holder.kill()
        if self.mux is not None:
            self.mux.close()
        for h in hosts:
            if h is not None:
                try:
                    h.close()
                except Exception:  # closing a dead connection must not mask the real error
                    pass
