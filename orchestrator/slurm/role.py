"""A Slurm login node's settings: where the array runs, with what, and how it is watched.

`SlurmRole` is what an inventory host's ``roles: {slurm: ...}`` holds
(`orchestrator.inventory` reads it with `from_mapping`). It is frozen and checked at
construction, one line per problem naming the field; `SlurmRole.from_mapping` takes the
values as a person writes them (``time_limit: "1:30:00"``, ``mem_per_task: 4G``) and names
the key path in its errors.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, fields
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.sizes import parse_size
from remote.protocol import is_int, is_number


class SlurmError(DflashError):
    """A Slurm role, plan or scheduler answer is unusable; the message is one line naming
    the host (or key) and the field."""


# Partition lists (``a,b``), account and QOS names: what Slurm itself accepts, and nothing
# a shell or sbatch's own option parser would read as more than one word.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
PARTITIONS = re.compile(rf"{NAME.pattern}(,{NAME.pattern})*")
# sbatch's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(
    r"(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)|(?P<m>\d+)(?::(?P<ms>\d+))?)"
)


def parse_time_limit(value: int | str) -> int:
    """Minutes (rounded up) from whole minutes or one of sbatch's forms: ``90``, ``"90"``,
    ``"1:30:00"``, ``"2-00"``, ``"0-12:00:00"``. Raises `SlurmError` otherwise."""
    if is_int(value):
        if value < 1:
            raise SlurmError(f"a time limit of {value} minutes is not at least 1")
        return value
    m = _TIME.fullmatch(value) if isinstance(value, str) else None
    if not m:
        raise SlurmError(f"not a Slurm time limit: {value!r} (use minutes, H:MM:SS or D-HH:MM:SS)")
    g = {k: int(v) if v else 0 for k, v in m.groupdict().items()}
    seconds = (
        g["d"] * 86400
        + (g["dh"] + g["h"]) * 3600
        + (g["dm"] + g["hm"] + g["m"]) * 60
        + g["ds"]
        + g["hs"]
        + g["ms"]
    )
    minutes = -(-seconds // 60)
    if minutes < 1:
        raise SlurmError(f"the time limit {value!r} is not at least one minute")
    return minutes


def check_shared_folder(path: str) -> str:
    """The shared folder as given, when it is one absolute, normalised path that Slurm's
    output patterns (``%``, ``\\``) and a remote shell read literally; else `SlurmError`."""
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or len(path) > 4096
        or any(c in "%\\" or ord(c) < 32 or ord(c) == 127 for c in path)
        or posixpath.normpath(path) != path.rstrip("/")
    ):
        raise SlurmError(
            f"shared: {path!r} is not an absolute, normalised path without '%', '\\' or "
            "control characters (the folder every node sees at the same path)"
        )
    return path.rstrip("/")


@dataclass(frozen=True)
class SlurmRole:
    """How dflash runs on one cluster through its login node.

    `shared` is a folder the login node and every compute node see at the same path (the
    job folders live under it). None for `partition`, `account`, `qos` or `mem_per_task_mib`
    means the cluster's default. `max_retries` bounds how often one task is resubmitted
    after a failure worth retrying; `poll_seconds` is the pause between two looks.
    `shards`: how many array tasks one eval is split into (fewer when it has fewer samples).
    """

    shared: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_minutes: int = 60
    cpus_per_task: int = 1
    mem_per_task_mib: int | None = None
    max_retries: int = 1
    poll_seconds: float = 5.0
    shards: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "shared", check_shared_folder(self.shared))
        for name, pattern in (
            ("partition", PARTITIONS),
            ("account", NAME),
            ("qos", NAME),
        ):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
                raise SlurmError(f"{name}: {value!r} is not a Slurm {name} name")
        for name, least in (
            ("time_limit_minutes", 1),
            ("cpus_per_task", 1),
            ("max_retries", 0),
            ("shards", 1),
        ):
            _whole(name, getattr(self, name), least)
        if self.mem_per_task_mib is not None:
            _whole("mem_per_task_mib", self.mem_per_task_mib, 1)
        if not is_number(self.poll_seconds) or not 0 < self.poll_seconds <= 600:
            raise SlurmError(f"poll_seconds: {self.poll_seconds!r} is not between 0 and 600")

    @classmethod
    def from_mapping(cls, values: dict[str, Any], what: str = "slurm") -> SlurmRole:
        """A role from the keys a person writes: those of the fields, except
        ``time_limit`` (minutes or sbatch's forms) and ``mem_per_task`` (a size such as
        ``4G``, rounded up to MiB). Errors name ``what.key``."""
        allowed = {f.name for f in fields(cls)} - {"time_limit_minutes", "mem_per_task_mib"}
        allowed |= {"time_limit", "mem_per_task"}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise SlurmError(
                f"{what}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
            )
        if "shared" not in values:
            raise SlurmError(f"{what}: missing required key 'shared'")
        kwargs = {k: v for k, v in values.items() if k not in ("time_limit", "mem_per_task")}
        for key, field_name, convert in (
            ("time_limit", "time_limit_minutes", parse_time_limit),
            ("mem_per_task", "mem_per_task_mib", _mib),
        ):
            if key in values:
                try:
                    kwargs[field_name] = convert(values[key])
                except DflashError as exc:
                    raise SlurmError(f"{what}.{key}: {exc}") from None
        try:
            return cls(**kwargs)
        except SlurmError as exc:  # its message starts with the field's name
            raise SlurmError(f"{what}.{exc}") from None


def _mib(value: Any) -> int:
    if not (is_int(value) or isinstance(value, str)):
        raise SlurmError(f"{value!r} is not a size (use e.g. 512M, 4G)")
    size = parse_size(value)
    if size < 1:
        raise SlurmError(f"{value!r} is not a size above zero")
    return -(-size // (1024 * 1024))


def _whole(name: str, value: Any, least: int) -> None:
    if not is_int(value) or value < least:
        raise SlurmError(f"{name}: {value!r} is not a whole number of at least {least}")
