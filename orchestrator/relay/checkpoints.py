"""Checkpoints on a trainer: what exists, which step, and whether the trainer is done with it.

A checkpoint is a folder (``step_12000/``, ``checkpoint-8000/``) or a single file
(``step_500.pt``) directly under the trainer's checkpoint folder; hidden names are not
checkpoints. Its step is the last number in its name.

Completeness (trainer role ``complete_rule``):

- ``marker``: the folder holds the marker file (``COMPLETE`` by default). A single-file
  checkpoint is complete when ``<name>.<marker>`` sits beside it.
- ``stable``: no file in it changed during the last ``stable_seconds`` (by the trainer's own
  clock). When something did, the relay looks again ``stable_seconds`` later and accepts it
  only if no size or mtime moved in between.
- ``auto`` (the default): ``marker`` as soon as any checkpoint in the folder carries the
  marker (that trainer writes markers, so one without it is unfinished), ``stable``
  otherwise.
"""

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
    """The step number of a checkpoint name: the number after ``step``/``checkpoint``/
    ``ckpt``/``iter`` (``step_12000`` -> 12000, ``checkpoint-8000`` -> 8000,
    ``step_500.pt`` -> 500), else the last run of digits; None without digits."""
    stem = re.sub(r"\.(pt|pth|bin|safetensors|ckpt|tar|gz|zip)$", "", name)
    named = _NAMED.findall(stem)
    if named:
        return int(named[-1])
    numbers = _NUMBER.findall(stem)
    return int(numbers[-1]) if numbers else None


@dataclass
class SourceFile:
    path: str  # relative to the checkpoint folder; the name itself for a single file
    size: int
    mtime: float
    link: bool = False  # a symlink to a regular file: its content is relayed
    resume: int = 0  # a partial file: the largest offset its host saved a hash state for


@dataclass
class Checkpoint:
    name: str
    kind: str  # "dir" | "file"
    files: list[SourceFile]
    step: int | None = None
    complete: bool = False
    reason: str = ""  # why it is not complete
    odd: list[dict] = field(default_factory=list)  # links that cannot be relayed, and why

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def signature(self) -> list[tuple[str, int, float]]:
        return sorted((f.path, f.size, round(f.mtime, 3)) for f in self.files)


def by_step(c: Checkpoint) -> tuple[int, str]:
    """Sort key: oldest first by step (no step counts as oldest), then by name."""
    return (c.step if c.step is not None else -1, c.name)


@dataclass
class Scan:
    """One look at a folder on a host (relay-scan)."""

    root: str
    now: float
    exists: bool
    free: int
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    partials: dict[str, list[SourceFile]] = field(default_factory=dict)
    manifests: dict[str, Any] = field(default_factory=dict)
    partial_odd: dict[str, list[dict]] = field(default_factory=dict)  # links in partials
    # entries whose name holds a line break, by their shown name: never relayable, but
    # listed (refused, with the reason) rather than silently missing
    unnamed: dict[str, Checkpoint] = field(default_factory=dict)

    @property
    def everything(self) -> list[Checkpoint]:
        """Every checkpoint there, relayable or not (`unnamed` too), oldest first."""
        return sorted([*self.checkpoints.values(), *self.unnamed.values()], key=by_step)


def scan(host: Host, root: str) -> Scan:
    """List `root` on `host`: checkpoints with file sizes and mtimes, partial folders,
    manifests of relayed checkpoints, and free bytes on its filesystem."""
    return parse_scan(
        root,
        run_remote_json(host, ["relay-scan", "--", root], python_flags=("-I", "-S")),
        host.name,
    )


class ScanRefused(DflashError):
    """A host's scan answer names a path that could leave its folder (or is malformed)."""


def parse_scan(root: str, data: Any, host: str = "host") -> Scan:
    """A `Scan` from the JSON that ``relay-scan`` (or ``relay-lock``) printed for `root`.

    The answer is the host's word, and every host is its own trust domain: each name and
    path in it is checked before use (one path component per checkpoint name; file paths
    relative and normalised, with no ``..``, NUL or line break; sizes whole and not
    negative). Anything else refuses the whole scan with one line naming `host`.
    """

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
        """What cannot be relayed in `where` (``{"path", "why", "link"}``), each checked."""
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
    """Scan the trainer's checkpoint folder and mark each checkpoint complete or not
    (see the module docstring for the rules). Takes a second look only when needed.
    `first`: the folder's scan when it came already (with ``relay-send``'s ready frame)."""
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
    # Marker files of single-file checkpoints are not checkpoints themselves.
    for name in [n for n in names if n.endswith("." + role.marker)]:
        first.checkpoints.pop(name, None)
    young: list[Checkpoint] = []
    for ckpt in first.checkpoints.values():
        if ckpt.odd:  # published without the file it would have lost it: refuse it
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
