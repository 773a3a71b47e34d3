"""A memory cgroup of the test's own, below this process's (cgroup v2 ``memory.max`` or v1
``memory.limit_in_bytes``), for a real OOM kill of a real job: the kernel's OOM killer
ends the largest process in it once its members together pass the limit. None where this
machine gives a test no such cgroup (no root, no delegated memory controller)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path


def _own(controller: str) -> Path | None:
    """This process's cgroup folder for `controller` ("" for the v2 unified one)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, names, path = (line.split(":", 2) + ["", ""])[:3]
        for mount in mounts:
            parts = mount.split()
            if len(parts) < 4:
                continue
            v2 = parts[2] == "cgroup2" and hid == "0" and controller == ""
            v1 = parts[2] == "cgroup" and controller in parts[3].split(",") and controller
            if (v2 or v1) and (controller == "" or controller in names.split(",")):
                return Path(parts[1], path.lstrip("/"))
    return None


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int, name: str) -> Iterator[Path | None]:
    """A new memory cgroup `name` limited to `limit_bytes` (its folder; write a pid to its
    ``cgroup.procs`` to put a process in), removed on the way out once empty; None where
    none can be made here."""
    made = None
    for controller, limit_file in (("memory", "memory.limit_in_bytes"), ("", "memory.max")):
        try:
            parent = _own(controller)
            if parent is None or not (parent / "cgroup.procs").exists():
                continue
            if controller == "" and "memory" not in (
                (parent / "cgroup.subtree_control").read_text().split()
            ):
                continue
            path = parent / name
            path.mkdir()
            try:
                (path / limit_file).write_text(str(limit_bytes))
            except OSError:
                path.rmdir()
                continue
            made = path
            break
        except OSError:
            continue
    try:
        yield made
    finally:
        if made is not None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.rmdir(made)  # refused while a process is still in it
                    break
                except OSError:
                    time.sleep(0.2)
