"""``dflash relay``: checkpoints from a trainer to eval hosts through this machine.

What a relay does, per checkpoint and destination:

1. **Look** (no payload): the trainer's folder is scanned and each checkpoint judged
   complete or not (`orchestrator.relay.checkpoints`); each destination's folder is locked for
   this relay (a second relay into it is refused, naming the holder) and scanned for
   published checkpoints (their ``.dflash-manifest.json``), partial folders and free space.
2. **Skip** what is already there: a published checkpoint whose manifest lists the same
   files, sizes and mtimes as the source costs 0 payload bytes. With ``verify`` its files
   are re-hashed ON the destination and compared with the manifest; a damaged file is sent
   again into a hidden temp file beside it and renamed over the damaged one.
3. **Resume**: files already in ``<drafters>/.partial-<name>/`` are kept. A file holding L
   bytes of a longer source file is resumed INSIDE the file: the sha256 of its first L bytes
   is computed on both hosts and, when equal, only bytes L.. are sent (otherwise it is sent
   from 0). A file at full size whose hash matches costs nothing.
4. **Refuse** before moving a byte when a destination lacks the space still needed (free
   bytes minus its reserve), with the numbers.
5. **Send**: the files go in up to ``jobs`` batches at once, each batch ONE stream per
   host (not one per file); each file is read once on the source and written to every
   destination (fan-out), see `orchestrator.relay.stream`. sha256 is
   computed on the hosts beside the stream: the source hashes what it reads, each
   destination what it writes (for a resumed file: its kept prefix plus what it appends).
   A mismatch is sent again once (from 0), then reported as a failure.
6. **Publish**: when every file of a checkpoint is verified on a destination, the manifest
   is written into the partial folder and the folder renamed to its final name: ONE rename,
   so an eval never sees half a checkpoint (the host refuses to publish if any file of the
   manifest is missing or short). A failed destination keeps its partial folder
   (the next relay resumes it) and does not stop the others.
7. **Keep**: with ``keep``, only the newest K relayed checkpoints (by step) stay on each
   destination; folders not relayed by dflash (no manifest) are never touched.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import socket
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.relay.checkpoints import (
    Checkpoint,
    Scan,
    SourceFile,
    judge_complete,
    parse_scan,
    scan,
)
from orchestrator.relay.stream import (
    Multiplexer,
    Stream,
    describe_failure,
    file_lines,
    pump,
    send_request,
    write_all,
)
from orchestrator.sizes import human_bytes, parse_size
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, Result, open_host, quote
from remote.protocol import MANIFEST, MANIFEST_FORMAT, PARTIAL_PREFIX, REPAIR_PREFIX

# The host-side relay commands are stdlib only: skip site-packages and environment
# (-I -S), which halves the interpreter's start on a host with many packages.
RELAY_PYTHON_FLAGS = ("-I", "-S")


class RelayError(DflashError):
    """The relay cannot start or did not finish; one line says what to do."""


class RelayIncomplete(RelayError):
    """The relay ran, but a destination failed or a checkpoint asked for was skipped."""

    exit_code = 1


# ---- options, progress, report ------------------------------------------------------------


@dataclass
class RelayOptions:
    """What to relay and how. With no selection the newest complete checkpoint is relayed."""

    names: list[str] = field(default_factory=list)
    step: int | None = None
    latest: bool = False
    all: bool = False
    src_dir: str | None = None
    dest_dir: str | None = None
    verify: bool = False
    dry_run: bool = False
    keep: int | None = None
    jobs: int | None = None  # streams at once; None: `default_jobs()`
    reserve: int | None = None  # bytes to leave free; None: the eval role's `reserve`
    lock_wait: float = 5.0  # seconds to wait for another relay into a destination folder


def default_jobs() -> int:
    """Streams at once when not told: one per two of this machine's cores, 1 to 4.

    Every stream keeps about two cores here busy (one ssh decrypting what the source
    sends, one encrypting it for the destination). On an idle 2-core box an 8 x 64 MiB
    checkpoint took 3.7 s with 1 or 2 streams and 4.1 s with 4 (processes fighting for
    the cores); more than one stream pays off where one ssh stream is cipher-bound.
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class Progress:
    """Receives progress; the CLI draws a rich bar from it, tests hook into it."""

    def start(self, total_bytes: int, total_files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file_done(self, checkpoint: str, path: str) -> None:
        pass

    def message(self, text: str) -> None:
        pass


@dataclass
class DestStatus:
    host: str
    status: str = "pending"  # relayed | unchanged | verified | repaired | failed | planned
    bytes_planned: int = 0  # payload this relay means to send (what --dry-run reports)
    bytes_sent: int = 0
    bytes_skipped: int = 0
    files_sent: int = 0
    repaired: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class CheckpointReport:
    name: str
    step: int | None
    size: int
    files: int
    destinations: dict[str, DestStatus] = field(default_factory=dict)


@dataclass
class RelayReport:
    source: str
    source_dir: str
    destinations: dict[str, str]  # host -> folder
    dry_run: bool = False
    checkpoints: list[CheckpointReport] = field(default_factory=list)
    incomplete: list[dict] = field(default_factory=list)
    pruned: dict[str, list[str]] = field(default_factory=dict)
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def bytes_sent(self) -> int:
        return sum(d.bytes_sent for c in self.checkpoints for d in c.destinations.values())

    @property
    def bytes_skipped(self) -> int:
        return sum(d.bytes_skipped for c in self.checkpoints for d in c.destinations.values())

    @property
    def files_sent(self) -> int:
        return sum(d.files_sent for c in self.checkpoints for d in c.destinations.values())

    @property
    def failures(self) -> list[tuple[str, str, str]]:
        return [
            (c.name, d.host, d.error or "failed")
            for c in self.checkpoints
            for d in c.destinations.values()
            if d.status == "failed"
        ]

    @property
    def skipped_named(self) -> list[dict]:
        """Checkpoints asked for by name or step that were not relayed (incomplete)."""
        return [i for i in self.incomplete if i.get("named")]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.skipped_named

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "source_dir": self.source_dir,
            "destinations": self.destinations,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "bytes_read": self.bytes_read,
            "bytes_sent": self.bytes_sent,
            "bytes_planned": sum(
                d.bytes_planned for c in self.checkpoints for d in c.destinations.values()
            ),
            "bytes_skipped": self.bytes_skipped,
            "files_sent": self.files_sent,
            "seconds": round(self.seconds, 3),
            "mib_per_s": round(self.bytes_read / self.seconds / 2**20, 1)
            if self.seconds > 0
            else None,
            "checkpoints": [
                {
                    "name": c.name,
                    "step": c.step,
                    "size": c.size,
                    "files": c.files,
                    "destinations": {h: asdict(d) for h, d in c.destinations.items()},
                }
                for c in self.checkpoints
            ],
            "incomplete": self.incomplete,
            "pruned": self.pruned,
        }


# ---- plan ---------------------------------------------------------------------------------


@dataclass
class Target:
    """One file to write on one destination."""

    dest: Dest
    write_path: str  # where the bytes go (in the partial folder, or a repair temp)
    offset: int  # bytes already there and verified
    rename_to: str | None = None  # repair: rename over the damaged published file
    sha256: str | None = None


@dataclass
class FileTask:
    ckpt: Checkpoint
    file: SourceFile
    src_path: str
    targets: list[Target]


@dataclass
class Dest:
    host: Host
    root: str
    scan: Scan
    reserve: int
    need: int = 0
    stale: list[str] = field(default_factory=list)  # partial files the source no longer has


def _src_path(root: str, ckpt: Checkpoint, f: SourceFile) -> str:
    return f"{root}/{ckpt.name}" if ckpt.kind == "file" else f"{root}/{ckpt.name}/{f.path}"


def _final_path(root: str, ckpt: Checkpoint, f: SourceFile) -> str:
    return _src_path(root, ckpt, f)


def _partial_path(root: str, ckpt: Checkpoint, f: SourceFile) -> str:
    return f"{root}/{PARTIAL_PREFIX}{ckpt.name}/{f.path}"


def _repair_path(final: str) -> str:
    head, tail = os.path.split(final)
    return f"{head}/{REPAIR_PREFIX}{tail}"


def _manifest_matches(manifest: dict | None, ckpt: Checkpoint) -> bool:
    if not manifest or manifest.get("format") != MANIFEST_FORMAT:
        return False
    try:
        listed = sorted(
            (f["path"], int(f["size"]), round(float(f["mtime"]), 3)) for f in manifest["files"]
        )
    except (KeyError, TypeError, ValueError):
        return False
    return listed == ckpt.signature()


def _damaged(manifest: dict, published: Checkpoint) -> set[str]:
    """Files of a published checkpoint missing, or differing in size or mtime from what
    its manifest says (``stored_mtime``: the mtime its host reported at publication)."""
    there = {f.path: f for f in published.files}
    out = set()
    for f in manifest["files"]:
        got = there.get(f["path"])
        stored = f.get("stored_mtime")
        if (
            got is None
            or got.size != f["size"]
            or got.link
            or (isinstance(stored, (int, float)) and got.mtime != stored)
        ):
            out.add(f["path"])
    return out


def _refuse_links(d: Dest, name: str) -> None:
    """A partial folder holds only files the relay wrote: a symlink there (or a name it
    cannot carry) is refused before anything is written through it."""
    odd = [(o.get("path"), o.get("why")) for o in d.scan.partial_odd.get(name, [])]
    odd += [(f.path, "is a symlink") for f in d.scan.partials.get(name, []) if f.link]
    if odd:
        path, why = odd[0]
        raise RelayError(
            f"{d.host.name}: {d.root}/{PARTIAL_PREFIX}{name}/{path} {why}; a "
            "partial folder holds only what the relay wrote: remove it, then "
            "relay again"
        )


def _hash_many(host: Host, requests: list[dict]) -> dict[tuple[str, int | None], dict]:
    """sha256 of files or prefixes on a host, one remote call: {(path, length): result}."""
    if not requests:
        return {}
    result = bundle.run_remote(
        host, ["relay-hash"], stdin=json.dumps(requests).encode(), python_flags=RELAY_PYTHON_FLAGS
    )
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        (req["path"], req.get("length")): ans for req, ans in zip(requests, answers, strict=False)
    }


def _parallel(calls: list) -> list:
    """Run zero-argument callables in threads; results in order; first error re-raised."""
    if len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


class _Relay:
    def __init__(
        self,
        inventory: Inventory,
        source: str,
        destinations: list[str],
        options: RelayOptions,
        progress: Progress | None,
    ):
        self.inv = inventory
        self.opts = options
        self.progress = progress or Progress()
        self.src_spec = inventory.host(source)
        dest_specs = inventory.expand(destinations)
        if not dest_specs:
            raise RelayError(
                "no destination: pass --to HOST[,HOST...] or set defaults.relay_to in the inventory"
            )
        if any(d.name == self.src_spec.name for d in dest_specs):
            raise RelayError(f"{source} is both the source and a destination; pick another --to")
        self.src_dir_cfg = self._src_dir(self.src_spec)
        self.dest_cfg = [(spec, self._dest_dir(spec)) for spec in dest_specs]
        self.src: Host | None = None
        self.dests: list[Dest] = []
        self.cancelled = threading.Event()
        self.use_mux = os.environ.get("DFLASH_RELAY_MUX", "1") != "0"
        self.mux: Multiplexer | None = None
        self._streams: set[Stream] = set()
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.locks: list = []  # host-side relay-lock holders, one per destination
        self.hashes: dict[tuple[str, str], dict[str, str]] = {}  # (ckpt, host) -> path -> sha

    # -- configuration ----------------------------------------------------------------------
    def _src_dir(self, spec: HostSpec) -> str:
        if self.opts.src_dir:
            return self.opts.src_dir
        if spec.trainer is None:
            raise RelayError(
                f"{spec.name} has no trainer role; add 'roles: {{trainer: "
                "{checkpoints: DIR}}' to it in the inventory or pass --src-dir"
            )
        return spec.trainer.checkpoints

    def _dest_dir(self, spec: HostSpec) -> str:
        if self.opts.dest_dir:
            return self.opts.dest_dir
        if spec.eval is None:
            raise RelayError(
                f"{spec.name} has no eval role; add 'roles: {{eval: {{drafters: "
                "DIR}}}' to it in the inventory or pass --dest-dir"
            )
        return spec.eval.drafters

    def _reserve(self, spec: HostSpec) -> int:
        if self.opts.reserve is not None:
            return self.opts.reserve
        if spec.eval is not None and spec.eval.reserve is not None:
            return parse_size(spec.eval.reserve)
        return 0

    # -- connections -------------------------------------------------------------------------
    def open(self) -> Scan:
        """Connect everywhere at once; scan the destinations and judge the source's
        checkpoints in parallel. Returns the source's scan."""
        self.src = open_host(self.src_spec, self.inv)
        dest_hosts = [open_host(spec, self.inv) for spec, _ in self.dest_cfg]
        if self.use_mux and not self.opts.dry_run:
            self.mux = Multiplexer(self.inv)

        def source() -> Scan:
            self.src_dir = self.src.expand(self.src_dir_cfg).rstrip("/") or "/"
            return self.look()

        def dest(h: Host, d: str) -> tuple[str, Scan]:
            root = h.expand(d).rstrip("/") or "/"
            return root, scan(h, root) if self.opts.dry_run else self._lock_root(h, root)

        if self.mux is not None:
            for h in [self.src, *dest_hosts]:
                self.mux.start(h)
        results = _parallel(
            [source]
            + [
                lambda h=h, d=d: dest(h, d)
                for h, (_, d) in zip(dest_hosts, self.dest_cfg, strict=False)
            ]
        )
        self.dests = [
            Dest(h, root, sc, self._reserve(spec))
            for h, (root, sc), (spec, _) in zip(
                dest_hosts, results[1 : 1 + len(dest_hosts)], self.dest_cfg, strict=False
            )
        ]
        return results[0]

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
        proc = host.popen(
            bundle.remote_command(
                host,
                ["relay-lock", f"--by={by}", f"--wait={self.opts.lock_wait}", "--", root],
                python_flags=RELAY_PYTHON_FLAGS,
            )
        )
        with self._lock:
            self.locks.append(proc)
        line = b""
        while not line.endswith(b"\n"):
            chunk = proc.read(4096)
            if not chunk:
                break
            line += chunk
        try:
            data = json.loads(line)
        except ValueError:
            code = proc.wait()
            bundle.check_result(host, Result("", proc.stderr(), code), ["relay-lock"])
            raise RelayError(f"{host.name}: no answer from relay-lock for {root}") from None
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
        return parse_scan(root, data.get("scan"), host.name)

    def close(self) -> None:
        for proc in self.locks:  # EOF ends the host-side holder, which drops the lock
            try:
                proc.close_stdin()
                proc.wait()
            except Exception:
                pass
            proc.kill()
        if self.mux is not None:
            self.mux.close()
        for h in [self.src, *[d.host for d in self.dests]]:
            if h is not None:
                try:
                    h.close()
                except Exception:  # closing a dead connection must not mask the real error
                    pass

    # -- selection ---------------------------------------------------------------------------
    def look(self) -> Scan:
        return judge_complete(self.src, self.src_dir, self._trainer_role())

    def _trainer_role(self):
        from orchestrator.inventory import TrainerRole

        return self.src_spec.trainer or TrainerRole(checkpoints=self.src_dir)

    def select(self, src_scan: Scan, report: RelayReport) -> list[Checkpoint]:
        ckpts = src_scan.checkpoints
        where = f"{self.src.name}:{self.src_dir}"
        o = self.opts
        if o.names:
            chosen = []
            for name in o.names:
                name = name.rstrip("/")
                if name not in ckpts:
                    have = ", ".join(sorted(ckpts)[-8:]) or "none"
                    raise RelayError(f"no checkpoint {name!r} in {where} (have: {have})")
                chosen.append(ckpts[name])
        elif o.step is not None:
            chosen = [c for c in ckpts.values() if c.step == o.step]
            if not chosen:
                steps = sorted({c.step for c in ckpts.values() if c.step is not None})
                raise RelayError(
                    f"no checkpoint for step {o.step} in {where} (steps there: "
                    f"{', '.join(map(str, steps[-8:])) or 'none'})"
                )
        elif o.all:
            chosen = sorted(ckpts.values(), key=_order)
        else:
            done = [c for c in ckpts.values() if c.complete]
            if not done:
                raise RelayError(
                    f"no complete checkpoint in {where} "
                    f"({len(ckpts)} there, none finished); see dflash relay "
                    "--list"
                )
            chosen = [max(done, key=_order)]
        out = []
        named = bool(o.names) or o.step is not None
        for c in chosen:
            if c.complete:
                out.append(c)
            else:
                report.incomplete.append(
                    {"name": c.name, "step": c.step, "reason": c.reason, "named": named}
                )
        return out

    # -- planning ----------------------------------------------------------------------------
    def plan(
        self, ckpts: list[Checkpoint], report: RelayReport
    ) -> list[tuple[CheckpointReport, list[FileTask]]]:
        """Decide per checkpoint and destination what to send, hashing prefixes where a
        partial file could be resumed; no payload moves here."""
        plans = []
        src_req: dict[tuple[str, int | None], dict] = {}
        dest_req: list[dict[tuple[str, int | None], dict]] = [{} for _ in self.dests]
        pending = []  # (ckpt, dest index, kind, file, src hash key, dest hash key, sha)
        for ckpt in ckpts:
            crep = CheckpointReport(ckpt.name, ckpt.step, ckpt.size, len(ckpt.files))
            for di, d in enumerate(self.dests):
                st = crep.destinations[d.host.name] = DestStatus(d.host.name)
                manifest = d.scan.manifests.get(ckpt.name)
                published = ckpt.name in d.scan.checkpoints
                if published and _manifest_matches(manifest, ckpt):
                    st.status = "unchanged"
                    st.bytes_skipped = ckpt.size
                    damaged = _damaged(manifest, d.scan.checkpoints[ckpt.name])
                    hashes = {f["path"]: f.get("sha256") for f in manifest["files"]}
                    for f in ckpt.files:
                        if f.path in damaged:  # gone or changed since: no hash needed
                            pending.append((ckpt, di, "repair", f, None, None, None))
                        elif self.opts.verify:
                            key = (_final_path(d.root, ckpt, f), None)
                            dest_req[di][key] = {"path": key[0]}
                            pending.append((ckpt, di, "verify", f, None, key, hashes[f.path]))
                    continue
                if published and manifest is None:
                    raise RelayError(
                        f"{d.host.name}: {d.root}/{ckpt.name} exists but was not "
                        "relayed by dflash (no manifest); move it away, then "
                        "relay again"
                    )
                _refuse_links(d, ckpt.name)
                partial = {f.path: f.size for f in d.scan.partials.get(ckpt.name, [])}
                names = {f.path for f in ckpt.files}
                d.stale += [
                    _partial_path(d.root, ckpt, SourceFile(p, 0, 0))
                    for p in partial
                    if p not in names
                ]
                for f in ckpt.files:
                    have = partial.get(f.path, 0)
                    if 0 < have <= f.size:
                        ks = (_src_path(self.src_dir, ckpt, f), have)
                        kd = (_partial_path(d.root, ckpt, f), have)
                        src_req[ks] = {"path": ks[0], "length": have}
                        dest_req[di][kd] = {"path": kd[0], "length": have}
                        pending.append((ckpt, di, "resume", f, ks, kd, None))
                    else:
                        pending.append((ckpt, di, "send", f, None, None, None))
            plans.append((ckpt, crep))
        answers = _parallel(
            [lambda: _hash_many(self.src, list(src_req.values()))]
            + [
                lambda d=d, r=r: _hash_many(d.host, list(r.values()))
                for d, r in zip(self.dests, dest_req, strict=False)
            ]
        )
        src_ans, dest_ans = answers[0], answers[1:]

        tasks: dict[tuple[str, str], FileTask] = {}
        out = []
        by_name = {c.name: rep for c, rep in plans}
        for ckpt, di, kind, f, ks, kd, want in pending:
            d = self.dests[di]
            st = by_name[ckpt.name].destinations[d.host.name]
            key = (ckpt.name, f.path)
            if kind in ("verify", "repair"):
                if kind == "verify" and dest_ans[di].get(kd, {}).get("sha256") == want:
                    continue
                st.repaired.append(f.path)
                final = _final_path(d.root, ckpt, f)
                target = Target(d, _repair_path(final), 0, rename_to=final)
                st.bytes_skipped -= f.size
            else:
                offset = 0
                if kind == "resume":
                    a, b = src_ans.get(ks, {}), dest_ans[di].get(kd, {})
                    if (
                        a.get("sha256")
                        and a.get("sha256") == b.get("sha256")
                        and a.get("complete")
                        and b.get("complete")
                    ):
                        offset = ks[1]
                if kind == "resume" and offset == f.size:  # whole and verified already
                    st.bytes_skipped += f.size
                    self._record(ckpt.name, d.host.name, f.path, a["sha256"])
                    continue
                st.bytes_skipped += offset
                target = Target(d, _partial_path(d.root, ckpt, f), offset)
            d.need += f.size - target.offset
            st.bytes_planned += f.size - target.offset
            task = tasks.get(key)
            if task is None:
                task = tasks[key] = FileTask(ckpt, f, _src_path(self.src_dir, ckpt, f), [])
            task.targets.append(target)
        for ckpt, crep in plans:
            ftasks = [t for (n, _), t in tasks.items() if n == ckpt.name]
            for st in crep.destinations.values():
                if st.status == "pending":
                    st.status = "planned"
            out.append((crep, ckpt, ftasks))
            report.checkpoints.append(crep)
        return out

    def _record(self, ckpt: str, host: str, path: str, sha: str) -> None:
        with self._lock:
            self.hashes.setdefault((ckpt, host), {})[path] = sha

    def check_space(self) -> None:
        for d in self.dests:
            room = d.scan.free - d.reserve
            if d.need > room:
                raise RelayError(
                    f"{d.host.name}: not enough space in {d.root}: this relay needs "
                    f"{human_bytes(d.need)} more, {human_bytes(d.scan.free)} is free and "
                    f"{human_bytes(d.reserve)} must stay free (reserve), short by "
                    f"{human_bytes(d.need - room)}; free space there, use --keep, or lower the "
                    "reserve"
                )

    # -- transfer ----------------------------------------------------------------------------
    def _start(self, host: Host, argv: list[str], *, stdin: bool, stdout: bool) -> Stream:
        line = bundle.remote_command(host, argv, python_flags=RELAY_PYTHON_FLAGS)
        s = Stream(host, line, self.inv, stdin=stdin, stdout=stdout, mux=self.mux)
        with self._lock:
            self._streams.add(s)
        return s

    def _forget(self, *streams: Stream) -> None:
        with self._lock:
            for s in streams:
                self._streams.discard(s)

    def kill_all(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            s.kill()

    def run_batch(self, tasks: list[FileTask], statuses: dict[str, DestStatus]) -> None:
        """Send a batch of files through one stream per host, re-sending a hash mismatch
        once (from 0, as a batch of its own)."""
        items = [(task, list(task.targets)) for task in tasks]
        for attempt in (1, 2):
            retry: dict[int, tuple[FileTask, list[Target]]] = {}
            for task, t, outcome in self._send(items):
                st = statuses[t.dest.host.name]
                if outcome == "ok":
                    continue
                if outcome == "mismatch" and attempt == 1:
                    t.offset = 0
                    retry.setdefault(id(task), (task, []))[1].append(t)
                    continue
                with self._lock:
                    st.status = "failed"
                    st.error = st.error or (
                        f"{task.ckpt.name}/{task.file.path}: "
                        + ("sha256 differs twice" if outcome == "mismatch" else outcome)
                    )
            if not retry:
                break
            items = list(retry.values())
            self.progress.message(
                "sha256 mismatch on "
                + ", ".join(task.file.path for task, _ in items)
                + "; sending again"
            )

    def _send(
        self, items: list[tuple[FileTask, list[Target]]]
    ) -> list[tuple[FileTask, Target, str]]:
        """One ``relay-send`` for all the files of `items`, one ``relay-recv`` per
        destination for the files it needs; outcome per (file, target): "ok", "mismatch"
        or what failed."""
        dests: list[Dest] = []
        for _, targets in items:
            dests += [t.dest for t in targets if t.dest not in dests]
        starts = [min(t.offset for t in targets) for _, targets in items]
        routes: list[list[int | None]] = []
        requests: list[list[dict]] = [[] for _ in dests]
        where: dict[tuple[int, int], tuple[Target, int]] = {}  # (file, dest) -> target, slot
        for i, (task, targets) in enumerate(items):
            route: list[int | None] = [None] * len(dests)
            for t in targets:
                j = dests.index(t.dest)
                route[j] = t.offset - starts[i]
                where[(i, j)] = (t, len(requests[j]))
                requests[j].append(
                    {
                        "path": t.write_path[len(t.dest.root.rstrip("/")) + 1 :],
                        "offset": t.offset,
                        "mtime": task.file.mtime,
                    }
                )
            routes.append(route)
        src = self._start(self.src, ["relay-send"], stdin=True, stdout=True)
        outs = [
            self._start(d.host, ["relay-recv", "--", d.root], stdin=True, stdout=True)
            for d in dests
        ]
        try:
            try:
                write_all(
                    src.stdin_fd,
                    json.dumps(
                        [
                            {"path": task.src_path, "offset": start}
                            for (task, _), start in zip(items, starts, strict=False)
                        ]
                    ).encode(),
                )
            except OSError:
                pass  # the source is gone: its exit status says why
            src.close_stdin()
            for s, req in zip(outs, requests, strict=False):
                send_request(s, req)
            read = pump(src, outs, routes, self.progress.advance, self.cancelled)
        except BaseException:
            for s in (src, *outs):
                s.kill()
            raise
        finally:
            for s in outs:
                s.close_stdin()
        src_killed = all(s.failed for s in outs)
        if src_killed:
            src.kill()  # nobody left to read for: do not drain the rest of the files
        with self._lock:
            self.bytes_read += sum(read)
        scode, _, serr = src.finish()
        src_sums = file_lines(serr)
        results = []
        for j, (d, s) in enumerate(zip(dests, outs, strict=False)):
            code, out, err = s.finish()
            got = file_lines(out.decode(errors="replace"))
            for i, (task, _) in enumerate(items):
                if (i, j) not in where:
                    continue
                t, slot = where[(i, j)]
                a, b = src_sums.get(i), got.get(slot)
                # Blame the side that failed: the source only when it failed on its own
                # (not killed by us because every destination had gone), and then first,
                # since a destination's "stream ended" follows from it.
                src_failed = a is None and scode != 0 and not src_killed
                if b is None and not src_failed:
                    outcome = (
                        describe_failure(d.host, code, err)
                        if code != 0
                        else f"{d.host.name}: {s.failed or 'no result'}"
                    )
                elif a is None:
                    outcome = (
                        describe_failure(self.src, scode, serr)
                        if scode != 0
                        else f"{self.src.name}: no result for {task.file.path}"
                    )
                elif (
                    a.get("sha256") == b.get("sha256")
                    and a.get("size") == b.get("size") == task.file.size
                ):
                    t.sha256 = b["sha256"]
                    outcome = "ok"
                else:
                    outcome = "mismatch"
                sent = max(0, read[i] - routes[i][j]) if i < len(read) else 0
                results.append((task, t, outcome))
                self._account(task, t, sent, outcome == "ok")
        self._forget(src, *outs)
        return results

    def _account(self, task: FileTask, t: Target, sent: int, ok: bool) -> None:
        st = self._statuses[task.ckpt.name][t.dest.host.name]
        with self._lock:
            st.bytes_sent += sent
        if not ok:
            return
        if t.rename_to:
            try:
                # -T: a symlink (to a folder) planted at the final name is replaced, never
                # moved into
                t.dest.host.run(["mv", "-f", "-T", "--", t.write_path, t.rename_to])
            except Exception as exc:  # this destination fails; the others go on
                with self._lock:
                    st.status, st.error = "failed", f"repair {task.file.path}: {exc}"
                return
        with self._lock:
            st.files_sent += 1
        self._record(task.ckpt.name, t.dest.host.name, task.file.path, t.sha256)
        self.progress.file_done(task.ckpt.name, task.file.path)

    def transfer(self, plans, report: RelayReport) -> None:
        self._statuses = {crep.name: crep.destinations for crep, _, _ in plans}
        total = sum(
            t.file.size - min(x.offset for x in t.targets) for _, _, tasks in plans for t in tasks
        )
        self.progress.start(total, sum(len(tasks) for _, _, tasks in plans))
        for d in self.dests:
            if d.stale:  # else they would be published with the checkpoint
                d.host.run(["rm", "-f", "--", *d.stale])
        for crep, ckpt, tasks in plans:
            if tasks:
                self._run_tasks(tasks, crep.destinations)
            self._finish_checkpoint(crep, ckpt)

    def _run_tasks(self, tasks: list[FileTask], statuses: dict[str, DestStatus]) -> None:
        jobs = self.opts.jobs or default_jobs()
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="relay")
        futures = [pool.submit(self.run_batch, b, statuses) for b in batches(tasks, jobs)]
        try:
            while True:
                done, not_done = wait(futures, timeout=0.2, return_when=FIRST_EXCEPTION)
                for f in done:
                    if f.exception() is not None:
                        raise f.exception()
                if not not_done:
                    break
        except BaseException:
            self.cancelled.set()
            self.kill_all()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    def _finish_checkpoint(self, crep: CheckpointReport, ckpt: Checkpoint) -> None:
        for d in self.dests:
            st = crep.destinations[d.host.name]
            if st.status == "failed":
                continue
            try:
                if st.status == "unchanged":
                    if st.repaired:
                        st.status = "repaired"
                    elif self.opts.verify:
                        st.status = "verified"
                    continue
                hashes = self.hashes.get((ckpt.name, d.host.name), {})
                manifest = {
                    "format": MANIFEST_FORMAT,
                    "checkpoint": ckpt.name,
                    "kind": ckpt.kind,
                    "step": ckpt.step,
                    "source": {"host": self.src.name, "path": f"{self.src_dir}/{ckpt.name}"},
                    "relayed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "size": ckpt.size,
                    "files": [
                        {
                            "path": f.path,
                            "size": f.size,
                            "sha256": hashes[f.path],
                            "mtime": f.mtime,
                            **({"link": True} if f.link else {}),
                        }
                        for f in ckpt.files
                    ],
                }
                bundle.run_remote(
                    d.host,
                    ["relay-publish", f"--kind={ckpt.kind}", "--", d.root, ckpt.name],
                    stdin=json.dumps(manifest).encode(),
                    python_flags=RELAY_PYTHON_FLAGS,
                )
                st.status = "relayed"
            except Exception as exc:  # one destination failing must not stop the others
                st.status = "failed"
                st.error = f"publish {ckpt.name}: {exc}"

    # -- keep ---------------------------------------------------------------------------------
    def prune(self, keep: int, report: RelayReport) -> None:
        for d in self.dests:
            try:
                now = scan(d.host, d.root)
            except Exception as exc:
                report.pruned[d.host.name] = [f"(not pruned: {exc})"]
                continue
            relayed = [c for c in now.checkpoints.values() if c.name in now.manifests]
            relayed.sort(key=_order, reverse=True)
            gone = relayed[keep:]
            for c in gone:
                path = f"{d.root}/{c.name}"
                extra = [f"{d.root}/.{c.name}{MANIFEST}"] if c.kind == "file" else []
                d.host.run(["rm", "-rf", "--", path, *extra])
            report.pruned[d.host.name] = [c.name for c in gone]


def batches(tasks: list[FileTask], jobs: int) -> list[list[FileTask]]:
    """Split the files into at most `jobs` batches of about equal bytes to send (largest
    file first into the lightest batch); each batch keeps the checkpoint's file order.

    A batch is one stream per host, however many files it holds: per file we measured
    ~0.25 s of process and channel start-up on each host, which made an 8 x 64 MiB
    checkpoint take 1.8x as long as one 512 MiB file.
    """
    jobs = max(1, min(jobs, len(tasks)))
    load = [0] * jobs
    out: list[list[FileTask]] = [[] for _ in range(jobs)]
    for task in sorted(tasks, key=lambda t: -(t.file.size - min(x.offset for x in t.targets))):
        k = load.index(min(load))
        out[k].append(task)
        load[k] += task.file.size - min(x.offset for x in task.targets)
    order = {id(t): n for n, t in enumerate(tasks)}
    return [sorted(b, key=lambda t: order[id(t)]) for b in out if b]


def _order(c: Checkpoint) -> tuple:
    return (c.step if c.step is not None else -1, c.name)


# ---- entry points -----------------------------------------------------------------------


def relay(
    inventory: Inventory,
    source: str,
    destinations: list[str],
    options: RelayOptions | None = None,
    progress: Progress | None = None,
) -> RelayReport:
    """Relay checkpoints from `source` to every host in `destinations` (see module doc).

    Returns a report; destinations that failed are marked in it (``report.ok`` is False)
    and keep their partial folders for the next run. Raises `RelayError` before moving a
    byte when the selection is empty or a destination lacks space. On Ctrl-C, every stream
    is ended and the partial data stays for the next relay to resume.
    """
    options = options or RelayOptions()
    t0 = time.monotonic()
    r = _Relay(inventory, source, destinations, options, progress)
    try:
        src_scan = r.open()
        report = RelayReport(
            r.src.name, r.src_dir, {d.host.name: d.root for d in r.dests}, dry_run=options.dry_run
        )
        ckpts = r.select(src_scan, report)
        plans = r.plan(ckpts, report)
        r.check_space()
        if not options.dry_run:
            r.transfer(plans, report)
            if options.keep is not None:
                r.prune(options.keep, report)
        report.bytes_read = r.bytes_read
        report.seconds = time.monotonic() - t0
        return report
    except KeyboardInterrupt:
        r.cancelled.set()
        r.kill_all()
        raise
    finally:
        r.close()


def list_checkpoints(
    inventory: Inventory, source: str, destinations: list[str], options: RelayOptions | None = None
) -> dict[str, Any]:
    """What exists on the source, whether complete, and where it is already relayed:
    ``relayed`` (manifest matches the source), ``stale`` (relayed, source changed since),
    ``partial`` (bytes there of the total) or ``no``."""
    options = options or RelayOptions()
    r = _Relay(inventory, source, destinations, options, None)
    r.use_mux = False  # nothing to stream
    try:
        src_scan = r.open()
        rows = []
        for c in sorted(src_scan.checkpoints.values(), key=_order):
            row = {
                "name": c.name,
                "step": c.step,
                "kind": c.kind,
                "files": len(c.files),
                "size": c.size,
                "complete": c.complete,
                "reason": c.reason,
                "destinations": {},
            }
            for d in r.dests:
                if c.name in d.scan.checkpoints and c.name in d.scan.manifests:
                    state = "relayed" if _manifest_matches(d.scan.manifests[c.name], c) else "stale"
                elif c.name in d.scan.partials:
                    have = sum(f.size for f in d.scan.partials[c.name])
                    state = f"partial {have}/{c.size}"
                else:
                    state = "no"
                row["destinations"][d.host.name] = state
            rows.append(row)
        return {
            "source": r.src.name,
            "source_dir": r.src_dir,
            "destinations": {d.host.name: d.root for d in r.dests},
            "checkpoints": rows,
        }
    finally:
        r.close()


__all__ = [
    "relay",
    "list_checkpoints",
    "RelayOptions",
    "RelayReport",
    "Progress",
    "RelayError",
    "RelayIncomplete",
    "quote",
]
