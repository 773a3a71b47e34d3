"""A Slurm login node's settings (an inventory host's ``roles: {slurm: ...}``), checked at
construction; the keys: docs/slurm.md, "The inventory role"."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, fields
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.sizes import parse_size
from remote.protocol import is_int, is_number


class SlurmError(DflashError):
    """A Slurm role, plan or scheduler answer is unusable (one line naming the field)."""


# what Slurm accepts, and nothing a shell or sbatch would read as more than one word
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
PARTITIONS = re.compile(rf"{NAME.pattern}(,{NAME.pattern})*")
_TIME = re.compile(
    r"(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)|(?P<m>\d+)(?::(?P<ms>\d+))?)"
)


def parse_time_limit(value: int | str) -> int:
    """Minutes (rounded up) from whole minutes or one of sbatch's forms (``"1:30:00"``,
    ``"2-00"``)."""
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
    """The shared folder, if absolute, normalised and read literally by Slurm's output
    patterns and a shell; else `SlurmError`."""
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
    """How dflash runs on one cluster through its login node; None: the cluster's default."""

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
        """A role from the keys a person writes (``time_limit``, ``mem_per_task: 4G``);
        errors name ``what.key``."""
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
        except SlurmError as exc:
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
