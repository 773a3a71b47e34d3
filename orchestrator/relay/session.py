"""The hosts of one relay: folders, connections, ssh masters and the destinations' locks,
opened at once and held until `close`."""

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
    if len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def hash_many(host: Host, requests: list[dict] | tuple[dict, ...]) -> dict[HashKey, dict]:
    """sha256 of files or prefixes on a host, one command: {(path, length): result}."""
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
    """Connected and locked hosts of one relay; `lock`: take the destinations' locks,
    `mux`: one ssh master per host, `ahead`: start the first ``relay-send`` while scanning."""

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
        self.hosts: dict[str, Host] = {}
        self.dests: list[Dest] = []
        self.mux: Multiplexer | None = None
        self._locks: list[LockHolder] = []
        self.receivers: dict[str, LockHolder] = {}
        self._guard = threading.Lock()
        self.spares: dict[str, Stream] = {}
        self._ahead = ahead and mux
        opened: list[Host] = []
        try:
            if mux:
                self.mux = Multiplexer(inventory)
            # Every host's `ssh -G` and the local `ssh -Q cipher` at once.
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
        return {d.name: d.root for d in self.dests}

    @property
    def where(self) -> str:
        return f"{self.src.name}:{self.src_dir}"

    def _look(self, folder: str) -> tuple[str, Scan]:
        """Expand the source folder and judge its checkpoints, scanned by the ``relay-send``
        started ahead, else by ``relay-scan``."""
        src_dir = _expand(self.src, folder)
        spare = self._spare(self.src, ["relay-send"], ("--scan", src_dir))
        first = None
        if spare is not None and spare.wait_ready():
            bundle.seen(self.src)
            try:
                first = parse_scan(src_dir, json.loads(spare.hello), self.src.name)
            except ValueError:
                first = None  # the usual way says what is wrong
        role = self.src_spec.trainer or TrainerRole(checkpoints=src_dir)
        return src_dir, judge_complete(self.src, src_dir, role, first=first)

    def _open_dest(self, host: Host, folder: str, lock: bool) -> tuple[str, Scan]:
        # The lock holder receives the first batch: no relay-recv ahead.
        root = _expand(host, folder)
        return root, self._lock_root(host, root) if lock else scan(host, root)

    def _spare(self, host: Host, argv: list[str], extra: tuple[str, ...] = ()) -> Stream | None:
        """Start `argv` on `host` ahead of need, or None."""
        if not self._ahead:
            return None
        line, _ = bundle.first_line(host, [*argv, *extra], RELAY_PYTHON_FLAGS)
        s = Stream(host, line, self.inv, stdin=True, stdout=True, mux=self.mux)
        s.argv = argv
        with self._guard:
            self.spares[host.name] = s
        return s

    def _start_lock(self, host: Host, argv: list[str], root: str) -> tuple[LockHolder, dict | None]:
        """Start ``relay-lock`` (the bundle pushed only if missing); (holder, first answer)."""
        line, guarded = bundle.first_line(host, argv, RELAY_PYTHON_FLAGS)
        holder = LockHolder(host, line, self.inv, mux=self.mux, root=root)
        with self._guard:
            self._locks.append(holder)
        answer = holder.first()
        if answer is not None:
            bundle.seen(host)
            return holder, answer
        code, _, err = holder.finish()
        if code == 255:  # ssh could not reach the host
            raise connection_error(host, err)
        if guarded and bundle.was_missing(host, code, err):
            bundle.ensure(host)  # pushed now: the retry is not guarded
            return self._start_lock(host, argv, root)
        bundle.check_result(host, Result("", err, code), ["relay-lock"])
        return holder, None

    def _lock_root(self, host: Host, root: str) -> Scan:
        """Take `root`'s relay lock on `host` until `close`, and scan under it."""
        try:
            user = getpass.getuser()
        except (OSError, KeyError):
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
        holder.keep_alive(self.opts.patience / 4)
        with self._guard:
            self.receivers[host.name] = holder
        return found

    def ask(self, dest: str, request: dict) -> dict:
        """One request to `dest`'s lock holder, its answer."""
        return self.receivers[dest].ask(request)

    def hash_all(self, dr: Draft) -> dict[str, dict[HashKey, dict]]:
        names = [n for n, reqs in dr.dest_requests.items() if reqs]
        answers = parallel([lambda n=n: self._hash(n, dr.dest_requests[n]) for n in names])
        return dict(zip(names, answers, strict=True))

    def _hash(self, dest: str, requests: tuple[dict, ...]) -> dict[HashKey, dict]:
        if dest not in self.receivers:  # a dry run: a command of its own
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
            # The host command ends on EOF; nobody waits for it.
            s.close_stdin()
            s.kill()
            s.finish()
        for holder in self._locks:  # EOF: the holder drops the lock
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
                except Exception:  # must not mask the real error
                    pass
