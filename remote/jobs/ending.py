"""Why a job's runner ended without saying so: the signal, and whether the OOM killer did it
(the witnesses: docs/eval.md); every read bounded, a failed one is one witness less."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

KMSG_MAX_RECORDS = 20000
KMSG_RECORD_BYTES = 8192


def _cgroup_memory_files() -> dict[str, Path]:
    """{name: file} holding this process's memory cgroup's OOM kill counter (v1 or v2)."""
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return {}
    v1 = v2 = None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup2":
            v2 = v2 or parts[1]
        elif len(parts) >= 4 and parts[2] == "cgroup" and "memory" in parts[3].split(","):
            v1 = v1 or parts[1]
    found = {}
    for line in groups:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if hid == "0" and v2:
            found["memory.events"] = Path(v2, rel, "memory.events")
        elif "memory" in controllers.split(",") and v1:
            found["memory.oom_control"] = Path(v1, rel, "memory.oom_control")
    return {k: p for k, p in found.items() if p.is_file()}


def _counter(path: Path, name: str = "oom_kill") -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def oom_counters() -> dict[str, int]:
    """The OOM kill counters this process can read now, by file."""
    out = {}
    for path in [*_cgroup_memory_files().values(), Path("/proc/vmstat")]:
        value = _counter(path)
        if value is not None:
            out[str(path)] = value
    return out


def kernel_oom_line(pids: list[int]) -> str | None:
    """The kernel log's OOM line naming one of `pids`; "" if none, None if unreadable."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    wanted = [f"Killed process {pid} " for pid in pids]
    found = ""
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                record = os.read(fd, KMSG_RECORD_BYTES)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record overwritten while read
                    continue
                break
            if not record:
                break
            text = record.decode(errors="replace").split(";", 1)[-1].splitlines()[0]
            if any(w in text for w in wanted):
                found = text.strip()[:300]
    finally:
        os.close(fd)
    return found


def oom_cause(pids: list[int], before: dict[str, int] | None) -> str:
    """Words for what the kernel says of an OOM kill of `pids` since `before`: certain
    (its log line, its cgroup's counter), likely (the system's) or none on record."""
    line = kernel_oom_line(pids)
    if line:
        return f'out of memory: the kernel\'s OOM killer ended it (kernel log: "{line}")'
    now = oom_counters()
    rose = sorted(
        (where == "/proc/vmstat", where, was, now[where])
        for where, was in (before or {}).items()
        if isinstance(was, int) and now.get(where, was) > was
    )
    if rose:
        likely, where, was, count = rose[0]
        return (
            f"{'probably ' if likely else ''}out of memory: oom_kill in {where} went from "
            f"{was} to {count} while it ran"
        )
    if line is None and not (before and now):
        return "no kernel log or OOM counter is readable here to tell whether it ran out of memory"
    return "the kernel recorded no OOM kill"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def killed(pid: int, signum: int, before: dict[str, int] | None, log: Path) -> dict:
    """The exit record's ``error``, ``signal``, ``oom`` and ``log`` for a runner `signum`
    killed."""
    cause = f"signal {signum}, exit status {128 + signum}"
    oom = False
    if signum == signal.SIGKILL:
        cause = oom_cause([pid], before)
        oom = cause.startswith(("out of memory", "probably"))
        if not oom:
            cause += ": kill -9 by someone, or a limit of the machine?"
    name = signal_name(signum)
    return {
        "error": f"the job's runner (pid {pid}) was killed by {name} ({cause}); log: {log}",
        "signal": name,
        "oom": oom,
        "log": str(log),
    }


def why_exited(pid: int, code: int, log: Path) -> str:
    """One line for a runner that exited with `code` without recording how it ended."""
    return (
        f"the job's runner (pid {pid}) exited with code {code} without recording how it "
        f"ended; log: {log}"
    )


def why_lost(pids: list[int], before: dict[str, int] | None, log: Path) -> str:
    """One line for a job whose runner and supervisor both died without a word."""
    cause = oom_cause(pids, before)
    if not cause.startswith(("out of memory", "probably")):
        cause = (
            "killed together with its supervisor (its process group or cgroup: kill -9, "
            f"systemd-oomd, a reboot?); {cause}"
        )
    shown = ", ".join(str(p) for p in pids)
    return f"the job's runner (pid {shown}) ended without recording how: {cause}; log: {log}"
