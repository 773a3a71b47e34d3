"""Checkpoints on a trainer (folders or single files under its folder): what exists, which
step, whether the trainer is done with it (docs/relay.md, "Completeness")."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.inventory import TrainerRole
from orchestrator.transport.bundle import run_remote_json
from orchestrator.transport.hosts import Host
from remote.protocol import is_int
from remote.relay.sha256state import GRID
from remote.relay.wire import PARTIAL_PREFIX, name_problem, path_problem

_NUMBER = re.compile(r"\d+")
_NAMED = re.compile(r"(?:step|checkpoint|ckpt|iter|global_step)[-_ ]?(\d+)", re.I)


def parse_step(name: str) -> int | None:
    """The step of a checkpoint name: the number after ``step``/``checkpoint``/``ckpt``/
    ``iter``, else the last run of digits; None without digits."""
    stem = re.sub(r"\.(pt|pth|bin|safetensors|ckpt|tar|gz|zip)$", "", name)
    named = _NAMED.findall(stem)
    if named:
        return int(named[-1])
    numbers = _NUMBER.findall(stem)
    return int(numbers[-1]) if numbers else None


@dataclass
class SourceFile:
    path: str  # the name itself for a single file
    size: int
    mtime: float
    link: bool = False
    resume: int = 0  # a partial file: the largest offset with a saved hash state


@dataclass
class Checkpoint:
    name: str
    kind: str  # "dir" | "file"
    files: list[SourceFile]
    step: int | None = None
    complete: bool = False
    reason: str = ""  # why it is not complete
    odd: list[dict] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def signature(self) -> list[tuple[str, int, float]]:
        return sorted((f.path, f.size, round(f.mtime, 3)) for f in self.files)


def by_step(c: Checkpoint) -> tuple[int, str]:
    """Sort key: oldest step first (none counts oldest), then name."""
    return (c.step if c.step is not None else -1, c.name)


@dataclass
class Scan:
    """One look at a folder on a host."""

    root: str
    now: float
    exists: bool
    free: int
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    partials: dict[str, list[SourceFile]] = field(default_factory=dict)
    manifests: dict[str, Any] = field(default_factory=dict)
    partial_odd: dict[str, list[dict]] = field(default_factory=dict)
    # names with a line break: listed as refused rather than missing
    unnamed: dict[str, Checkpoint] = field(default_factory=dict)

    @property
    def everything(self) -> list[Checkpoint]:
        return sorted([*self.checkpoints.values(), *self.unnamed.values()], key=by_step)


def scan(host: Host, root: str) -> Scan:
    return parse_scan(
        root,
        run_remote_json(host, ["relay-scan", "--", root], python_flags=("-I", "-S")),
        host.name,
    )


class ScanRefused(DflashError):
    """A host's scan answer names a path that could leave its folder (or is malformed)."""


def parse_scan(root: str, data: Any, host: str = "host") -> Scan:
    """A `Scan` from a host's scan JSON for `root`; anything that could leave the folder
    refuses the whole scan, naming `host` (docs/relay.md, "Trust")."""

    def refuse(what: str) -> ScanRefused:
        return ScanRefused(
            f"{host}: refusing its scan of {root}: {what}; that host's dflash "
            "bundle or its files are not to be trusted as they are"
        )

    def name(n: Any, what: str) -> str:
        why = name_problem(n)
        if why is not None:
            raise refuse(f"{what} {str(n)[:80]!r} {why}")
        return n

    def odd_entries(items: Any, where: str) -> list[dict]:
        out = []
        for o in items or []:
            files([{"path": o.get("path"), "size": 0, "mtime": 0}], where)
            why = o.get("why")
            if not isinstance(why, str) or not why or len(why) > 200 or not why.isprintable():
                raise refuse(f"the reason given for {where}/{o.get('path')} is not one line")
            out.append({"path": o["path"], "why": why, "link": o.get("link") is True})
        return out

    def files(items: Any, where: str) -> list[SourceFile]:
        if not isinstance(items, list):
            raise refuse(f"the file list of {where} is not a list")
        out = []
        for f in items:
            try:
                path, size, mtime = f["path"], f["size"], f["mtime"]
            except (KeyError, TypeError):
                raise refuse(f"a file entry of {where} is malformed") from None
            why = path_problem(path)
            if why is not None:
                raise refuse(f"the path {str(path)[:80]!r} in {where} {why}")
            if not is_int(size) or size < 0 or not isinstance(mtime, (int, float)):
                raise refuse(f"the size or mtime of {where}/{path} is not a number")
            resume = f.get("resume", 0)
            if not is_int(resume) or not 0 <= resume <= size or resume % GRID:
                raise refuse(f"the resume offset of {where}/{path} is not a grid point in it")
            out.append(SourceFile(path, size, float(mtime), bool(f.get("link")), resume))
        return out

    try:
        out = Scan(
            root=root,
            now=float(data["now"]),
            exists=bool(data["exists"]),
            free=int(data["free"]),
            manifests={
                name(k, "the checkpoint name"): v
                for k, v in data["manifests"].items()
                if isinstance(v, dict)
            },
        )
        entries, partials = data["entries"], data["partials"]
        for entry in entries:
            n = name(entry["name"], "the checkpoint name")
            kind = entry["kind"]
            fl = files(entry["files"], n)
            if kind not in ("dir", "file") or (kind == "file" and [f.path for f in fl] != [n]):
                raise refuse(f"the entry {n!r} is neither a folder nor a single file")
            odd = odd_entries(entry.get("odd"), n)
            out.checkpoints[n] = Checkpoint(n, kind, fl, parse_step(n), odd=odd)
        for n, items in partials.items():
            out.partials[name(n, "the partial folder")] = files(items, PARTIAL_PREFIX + n)
        for n, odd in (data.get("partial_odd") or {}).items():
            out.partial_odd[n] = odd_entries(odd, PARTIAL_PREFIX + name(n, "the partial folder"))
        for entry in data.get("unnamed") or []:
            n, kind = name(entry["name"], "the shown name"), entry["kind"]
            if kind not in ("dir", "file"):
                raise refuse(f"the entry {n!r} is neither a folder nor a single file")
            out.unnamed[n] = Checkpoint(
                n, kind, [], parse_step(n), reason="its name has a line break; rename it"
            )
    except (KeyError, TypeError, AttributeError, ValueError):
        raise refuse("the answer is malformed") from None
    return out


def _has_marker(ckpt: Checkpoint, marker: str, siblings: set[str]) -> bool:
    if ckpt.kind == "dir":
        return any(f.path == marker for f in ckpt.files)
    return f"{ckpt.name}.{marker}" in siblings


def judge_complete(
    host: Host, root: str, role: TrainerRole, sleep=time.sleep, first: Scan | None = None
) -> Scan:
    """Scan the trainer's folder (`first`: a scan that came already) and judge completeness."""
    first = first if first is not None else scan(host, root)
    if not first.exists:
        raise DflashError(
            f"{host.name}: checkpoint folder {root} does not exist; fix "
            "'checkpoints' of its trainer role in the inventory or pass "
            "--src-dir"
        )
    names = set(first.checkpoints)
    rule = role.complete_rule
    if rule == "auto":
        rule = (
            "marker"
            if any(_has_marker(c, role.marker, names) for c in first.checkpoints.values())
            else "stable"
        )
    for name in [n for n in names if n.endswith("." + role.marker)]:
        first.checkpoints.pop(name, None)
    young: list[Checkpoint] = []
    for ckpt in first.checkpoints.values():
        if ckpt.odd:  # published without that file, it would be incomplete
            o = ckpt.odd[0]
            what = f"{ckpt.name}/{o['path']} {o['why']}"
            ckpt.reason = (
                f"the symlink {what}; replace it with the file it stands for, or remove it"
                if o["link"]
                else f"{what}; rename it, or remove it"
            )
        elif not ckpt.files:
            ckpt.reason = "empty"
        elif rule == "marker":
            ckpt.complete = _has_marker(ckpt, role.marker, names)
            ckpt.reason = "" if ckpt.complete else f"no {role.marker} marker yet"
        else:
            newest = max(f.mtime for f in ckpt.files)
            if first.now - newest >= role.stable_seconds:
                ckpt.complete = True
            else:
                young.append(ckpt)
    if young:
        sleep(role.stable_seconds)
        second = scan(host, root)
        for ckpt in young:
            again = second.checkpoints.get(ckpt.name)
            if again is not None and again.signature() == ckpt.signature() and not again.odd:
                ckpt.complete = True
            else:
                ckpt.reason = f"still being written (changed within {role.stable_seconds:g}s)"
    return first
