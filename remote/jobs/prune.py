"""``job prune``: old finished job folders and cache entries removed, never following a link
nor touching a running job (docs/eval.md, "The host's workdir, and making room")."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager

from remote.jobs.folder import job_state, jobs_root
from remote.protocol import JobState

CACHES = {"ground-truth": "groundtruth", "features": "features"}
CACHE_LOCKS = {"features": ".lock"}  # `remote.eval.feature_cache`'s flock
# on a Slurm login node a task still running on a compute node looks lost too
LOST_GRACE_SECONDS = 86400.0
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _open_dir(name: str, dir_fd: int | None = None) -> int | None:
    """`name` opened as a folder without following a link; None where there is none."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def _measure(dir_fd: int, name: str) -> tuple[int, float]:
    """(bytes, newest modification time) of `name` and all under it, links not followed."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    size, newest = (st.st_size if not stat.S_ISDIR(st.st_mode) else 0), st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, _DIR, dir_fd=dir_fd)
        try:
            for child in os.listdir(fd):
                more, when = _measure(fd, child)
                size, newest = size + more, max(newest, when)
        finally:
            os.close(fd)
    return size, newest


def _remove(dir_fd: int, name: str) -> None:
    """Remove `name` and all under it through descriptors, never following a link."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _DIR, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            _remove(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


@contextmanager
def _locked(dir_fd: int, lock: str | None) -> Iterator[None]:
    """The cache's own lock, if it has one, held while its entries go."""
    if lock is None:
        yield
        return
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class _Pruning:
    """One prune's findings: `entries` to remove (or removed), `skipped` with why."""

    def __init__(self, workdir: str, older_than: float, now: float) -> None:
        self.root = os.path.expanduser(workdir)
        self.older_than, self.now = older_than, now
        self.entries: list[dict] = []
        self.skipped: list[dict] = []
        self.busy = False  # a job may run: the caches stay

    def area(self, folder: str) -> int | None:
        """The workdir's `folder` opened (None: absent, or a link, said in `skipped`)."""
        path = os.path.join(self.root, folder)
        try:
            return _open_dir(path)
        except OSError as exc:
            link = exc.errno in (errno.ELOOP, errno.ENOTDIR)
            why = "a link or a file, not a folder: not followed" if link else exc.strerror
            self.skipped.append({"path": path, "why": why})
            return None

    def jobs(self) -> None:
        fd = self.area("jobs")
        if fd is None:
            return
        try:
            for name in sorted(os.listdir(fd)):
                self._each(fd, "jobs", name, self._job)
        finally:
            os.close(fd)

    def _each(self, fd: int, area: str, name: str, look) -> None:
        """`look` at one entry; one gone meanwhile is nothing, one unreadable is said."""
        try:
            look(fd, name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            path = os.path.join(self.root, CACHES.get(area, area), name)
            self.skipped.append({"path": path, "why": f"not read: {exc.strerror or exc}"})

    def _add(self, fd: int, area: str, name: str, **more) -> None:
        """`name` goes when nothing under it was written for `older_than`."""
        size, newest = _measure(fd, name)
        if self.now - newest >= self.older_than:
            path = os.path.join(self.root, CACHES.get(area, area), name)
            row = {"path": path, "area": area, "name": name, "bytes": size}
            self.entries.append({**row, "age": self.now - newest, **more})

    def _job(self, fd: int, name: str) -> None:
        path = os.path.join(self.root, "jobs", name)
        if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            self.skipped.append({"path": path, "why": "not a job folder (a link or a file)"})
            return
        state = job_state(jobs_root(self.root) / name)["state"]
        if state in (JobState.RUNNING, JobState.STARTING):
            self.busy = True
            self.skipped.append({"path": path, "why": f"job {state}: never touched"})
            return
        if state == JobState.LOST and self.now - _measure(fd, name)[1] < LOST_GRACE_SECONDS:
            self.busy = True
            why = "job lost less than a day ago (a Slurm task may still run elsewhere): kept"
            self.skipped.append({"path": path, "why": why})
            return
        self._add(fd, "jobs", name, state=state)

    def cache(self, area: str) -> None:
        folder = CACHES[area]
        if self.busy:
            path = os.path.join(self.root, folder)
            self.skipped.append({"path": path, "why": "a job runs on this host: it may read it"})
            return
        fd = self.area(folder)
        if fd is None:
            return
        try:
            for name in sorted(os.listdir(fd)):
                if name != CACHE_LOCKS.get(area):
                    self._each(fd, area, name, lambda d, n: self._add(d, area, n))
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Remove every entry; one that cannot go moves to `skipped` with the OS's reason."""
        for area in ("jobs", *CACHES):
            mine = [e for e in self.entries if e["area"] == area]
            fd = self.area(CACHES.get(area, area)) if mine else None
            if fd is None:
                continue
            try:
                with _locked(fd, CACHE_LOCKS.get(area)):
                    for entry in mine:
                        try:
                            _remove(fd, entry["name"])
                        except OSError as exc:
                            self.entries.remove(entry)
                            self.skipped.append(
                                {
                                    "path": entry["path"],
                                    "why": f"not removed: {exc.strerror or exc}",
                                }
                            )
            finally:
                os.close(fd)


def prune(
    workdir: str, older_than: float, caches: list[str], dry_run: bool, now: float | None = None
) -> dict:
    """What goes from `workdir`, removed unless `dry_run`."""
    run = _Pruning(workdir, older_than, time.time() if now is None else now)
    run.jobs()
    for area in caches:
        run.cache(area)
    if not dry_run:
        run.remove()
    return {
        "workdir": run.root,
        "dry_run": dry_run,
        "older_than": older_than,
        "entries": [{k: v for k, v in e.items() if k != "name"} for e in run.entries],
        "skipped": run.skipped,
    }
