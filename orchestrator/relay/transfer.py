"""Moving the bytes of a plan: batches of files, one ``relay-send`` and one receiver per
destination each, a mismatch sent again (docs/relay.md, "Data path", "Integrity")."""

from __future__ import annotations

import json
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace

from orchestrator.inventory import Inventory
from orchestrator.relay.holder import LockHolder
from orchestrator.relay.options import RELAY_PYTHON_FLAGS, default_jobs, host_patience
from orchestrator.relay.plan import CheckpointPlan, Dest, FileTask, Target
from orchestrator.relay.publish import put_repaired
from orchestrator.relay.report import DestStatus, Progress
from orchestrator.relay.stream import STALL, Stream, file_lines, pump, send_request
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host
from orchestrator.transport.master import Multiplexer
from remote.protocol import is_int
from remote.relay.fdfiles import write_all

Outcome = tuple[FileTask, Target, str, "str | None"]  # task, target, outcome, sha256


def batches(tasks: list[FileTask] | tuple[FileTask, ...], jobs: int) -> list[list[FileTask]]:
    """At most `jobs` batches of about equal bytes, each in the checkpoint's order."""
    jobs = max(1, min(jobs, len(tasks)))
    load = [0] * jobs
    out: list[list[FileTask]] = [[] for _ in range(jobs)]
    for task in sorted(tasks, key=lambda t: -t.to_send):
        k = load.index(min(load))
        out[k].append(task)
        load[k] += task.to_send
    order = {id(t): n for n, t in enumerate(tasks)}
    return [sorted(b, key=lambda t: order[id(t)]) for b in out if b]


def _int(record: dict | None, key: str) -> int:
    """A count from a host's per-file line; anything but a non-negative int is 0."""
    value = (record or {}).get(key)
    return value if is_int(value) and value >= 0 else 0


def _first(where: dict[tuple[int, int], object], i: int) -> int:
    """The first destination of file `i`: the source's counts go there once."""
    return min(j for (k, j) in where if k == i)


class Transfer:
    """Sends the tasks of a plan from `src` to the destinations' `hosts`."""

    def __init__(
        self,
        inventory: Inventory,
        src: Host,
        hosts: dict[str, Host],
        *,
        mux: Multiplexer | None = None,
        jobs: int | None = None,
        progress: Progress | None = None,
        spares: dict[str, Stream] | None = None,
        receivers: dict[str, LockHolder] | None = None,
        stall: float = STALL,
    ):
        self.inv = inventory
        self.stall = stall
        self.src = src
        self.hosts = hosts
        self.mux = mux
        self.jobs = jobs or default_jobs()
        self.progress = progress or Progress()
        self.cancelled = threading.Event()
        self.bytes_read = 0
        self.hashes: dict[tuple[str, str], dict[str, str]] = {}  # (ckpt, host) -> path -> sha
        self._streams: set[Stream] = set()
        self._lock = threading.Lock()
        self.spares = spares if spares is not None else {}
        self.receivers = receivers if receivers is not None else {}

    def clear_stale(self, stale: dict[str, tuple[str, ...]]) -> None:
        """Remove partial files the source no longer has (else they would be published)."""
        for name, paths in stale.items():
            if paths:
                self.hosts[name].run(["rm", "-f", "--", *paths])

    def cancel(self) -> None:
        """End every stream now (Ctrl-C)."""
        self.cancelled.set()
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            s.kill()

    def run(self, cp: CheckpointPlan) -> None:
        """Send one checkpoint's files, `jobs` batches at once."""
        if not cp.tasks:
            return
        statuses = cp.report.destinations
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="relay")
        futures = [pool.submit(self.run_batch, b, statuses) for b in batches(cp.tasks, self.jobs)]
        try:
            # Poll, so that Ctrl-C reaches this (main) thread.
            while True:
                done, not_done = wait(futures, timeout=0.2, return_when=FIRST_EXCEPTION)
                for f in done:
                    if f.exception() is not None:
                        raise f.exception()
                if not not_done:
                    break
        except BaseException:
            self.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    def run_batch(self, tasks: list[FileTask], statuses: dict[str, DestStatus]) -> None:
        """Send a batch, re-sending a mismatch from 0 once (a resumed file twice)."""
        items = [(task, list(task.targets)) for task in tasks]
        resent: set[tuple[int, str]] = set()
        for _ in range(3):
            retry: dict[int, tuple[FileTask, list[Target]]] = {}
            for task, t, outcome, _ in self._send(items, statuses):
                st = statuses[t.dest.name]
                if outcome == "ok":
                    continue
                key = (id(task), t.dest.name)
                if outcome == "mismatch" and (t.offset > 0 or key not in resent):
                    if t.offset == 0:
                        resent.add(key)
                    with self._lock:
                        st.bytes_skipped -= t.offset
                    retry.setdefault(id(task), (task, []))[1].append(replace(t, offset=0))
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

    def _start(self, host: Host, argv: list[str], *, stdin: bool, stdout: bool) -> Stream:
        line = bundle.remote_command(host, argv, python_flags=RELAY_PYTHON_FLAGS)
        with self._lock:
            spare = self.spares.pop(host.name, None)
        if spare is not None and spare.argv == argv and spare.wait_ready():
            s = spare
        else:
            if spare is not None:
                spare.close_stdin()
                spare.finish()
            s = Stream(host, line, self.inv, stdin=stdin, stdout=stdout, mux=self.mux)
        with self._lock:
            self._streams.add(s)
        return s

    def _receiver(self, d: Dest) -> Stream:
        """The batch's receiver on `d`: its lock holder, unless busy; a lost one is
        returned so the batch fails there."""
        holder = self.receivers.get(d.name)
        if holder is not None and holder.root == d.root:
            if holder.borrow() or holder.lost:
                with self._lock:
                    self._streams.add(holder)
                return holder
        argv = ["relay-recv", f"--patience={host_patience(self.stall):g}", "--", d.root]
        return self._start(self.hosts[d.name], argv, stdin=True, stdout=True)

    def _unlocked(
        self, items: list[tuple[FileTask, list[Target]]]
    ) -> tuple[list[Outcome], list[tuple[FileTask, list[Target]]]]:
        """(failures, rest of `items`): a destination whose lock holder ended gets no more."""
        failed: list[Outcome] = []
        rest = []
        for task, targets in items:
            keep = []
            for t in targets:
                holder = self.receivers.get(t.dest.name)
                if holder is not None and holder.lost:
                    why = f"{t.dest.name}: the relay's lock there ended; relay again"
                    failed.append((task, t, why, None))
                else:
                    keep.append(t)
            if keep:
                rest.append((task, keep))
        return failed, rest

    def _forget(self, *streams: Stream) -> None:
        with self._lock:
            for s in streams:
                self._streams.discard(s)

    def _send(
        self, items: list[tuple[FileTask, list[Target]]], statuses: dict[str, DestStatus]
    ) -> list[Outcome]:
        """One batch: outcome per (file, target): "ok" (with sha256), "mismatch" or why not."""
        results, items = self._unlocked(items)
        if not items:
            return results
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
                req = {"path": t.relative, "offset": t.offset, "mtime": task.file.mtime}
                if t.saved_state and t.offset:
                    req["state"] = True
                requests[j].append(req)
            routes.append(route)
        src = self._start(self.src, ["relay-send"], stdin=True, stdout=True)
        outs = [self._receiver(d) for d in dests]
        pumped = None
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
                pass  # its exit status says why
            src.close_stdin()
            for s, req in zip(outs, requests, strict=False):
                send_request(s, req)
            pumped = pump(src, outs, routes, self.progress.advance, self.cancelled, self.stall)
        except BaseException:
            for s in (src, *outs):
                s.kill()
            raise
        finally:
            for j, s in enumerate(outs):
                # a receiver waiting on a frame that never comes must be told
                s.end_frames(pumped is not None and pumped.whole[j])
        read = pumped.read
        src_killed = all(s.failed for s in outs)
        if src_killed:
            src.kill()  # nobody left to read for
        with self._lock:
            self.bytes_read += sum(read)
        scode, _, serr = src.finish()
        src_sums = file_lines(serr)
        for j, (d, s) in enumerate(zip(dests, outs, strict=False)):
            code, out, err = s.end_batch()
            got = file_lines(out.decode(errors="replace"))
            for i, (task, _) in enumerate(items):
                if (i, j) not in where:
                    continue
                t, slot = where[(i, j)]
                a, b = src_sums.get(i), got.get(slot)
                sha = None
                # The source is blamed only when it failed on its own, and then first.
                src_failed = a is None and scode != 0 and not src_killed
                with self._lock:
                    statuses[d.name].prefix_hashed += _int(b, "prefix_read") + (
                        _int(a, "prefix_read") if j == _first(where, i) else 0
                    )
                if b is None and not src_failed:
                    outcome = (
                        s.describe(code, err)
                        if code != 0
                        else f"{d.name}: {s.failed or 'no result'}"
                    )
                elif a is None:
                    outcome = (
                        src.describe(scode, serr)
                        if scode != 0
                        else f"{self.src.name}: no result for {task.file.path}"
                    )
                elif (
                    a.get("sha256") == b.get("sha256")
                    and a.get("size") == b.get("size") == task.file.size
                ):
                    sha = b["sha256"]
                    outcome = "ok"
                else:
                    outcome = "mismatch"
                sent = max(0, read[i] - routes[i][j]) if i < len(read) else 0
                results.append((task, t, outcome, sha))
                self._account(task, t, sent, sha, statuses[d.name])
        self._forget(src, *outs)
        return results

    def _account(
        self, task: FileTask, t: Target, sent: int, sha: str | None, st: DestStatus
    ) -> None:
        """Count what was sent; put a whole file in place and record its hash."""
        with self._lock:
            st.bytes_sent += sent
        if sha is None:
            return
        if t.rename_to:
            try:
                put_repaired(self.hosts[t.dest.name], t)
            except Exception as exc:  # this destination fails; the others go on
                with self._lock:
                    st.status, st.error = "failed", f"repair {task.file.path}: {exc}"
                return
        with self._lock:
            st.files_sent += 1
            self.hashes.setdefault((task.ckpt.name, t.dest.name), {})[task.file.path] = sha
        self.progress.file_done(task.ckpt.name, task.file.path)
