"""What to send where: scans in, typed tasks out (pure: no I/O). `draft` sorts the files,
`decide` settles them with the destinations' hashes (docs/relay.md, "Resume")."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.relay.checkpoints import Checkpoint, Scan, SourceFile
from orchestrator.relay.report import CheckpointReport, DestStatus, RelayError
from orchestrator.relay.selection import manifest_matches
from orchestrator.sizes import human_bytes
from remote.protocol import PARTIAL_PREFIX, REPAIR_PREFIX

HashKey = tuple[str, "int | None"]  # (path, prefix length or None)


@dataclass(frozen=True, eq=False)
class Dest:
    """A destination as the planner sees it; compared by identity."""

    name: str
    root: str
    scan: Scan
    reserve: int = 0


@dataclass(frozen=True)
class Target:
    dest: Dest
    write_path: str
    offset: int  # bytes kept, proved by the whole file's hash after
    rename_to: str | None = None  # repair: rename over the damaged file
    saved_state: bool = False

    @property
    def relative(self) -> str:
        return self.write_path[len(self.dest.root.rstrip("/")) + 1 :]


@dataclass(frozen=True)
class FileTask:
    """One source file to read once and write to each of its targets."""

    ckpt: Checkpoint
    file: SourceFile
    src_path: str
    targets: tuple[Target, ...]

    @property
    def start(self) -> int:
        return min(t.offset for t in self.targets)

    @property
    def to_send(self) -> int:
        return self.file.size - self.start


@dataclass(frozen=True)
class CheckpointPlan:
    ckpt: Checkpoint
    report: CheckpointReport
    tasks: tuple[FileTask, ...]


@dataclass(frozen=True)
class Plan:
    """Everything a relay will send, and what each destination needs for it."""

    checkpoints: tuple[CheckpointPlan, ...]
    need: dict[str, int]  # destination -> payload bytes
    stale: dict[str, tuple[str, ...]]  # destination -> partial files to remove first

    @property
    def total_bytes(self) -> int:
        return sum(t.to_send for c in self.checkpoints for t in c.tasks)

    @property
    def total_files(self) -> int:
        return sum(len(c.tasks) for c in self.checkpoints)


@dataclass(frozen=True)
class Check:
    """A file on a destination whose fate may wait for hashes."""

    ckpt: Checkpoint
    dest: Dest
    kind: str  # send | resume | verify | repair
    file: SourceFile
    have: int = 0
    dest_key: HashKey | None = None
    want: str | None = None  # verify: the manifest's sha256
    saved_state: bool = False


@dataclass(frozen=True)
class Draft:
    """The first half of a plan: checks and the hash requests they need."""

    ckpts: tuple[Checkpoint, ...]
    dests: tuple[Dest, ...]
    unchanged: frozenset[tuple[str, str]]
    checks: tuple[Check, ...]
    dest_requests: dict[str, tuple[dict, ...]]
    stale: dict[str, tuple[str, ...]]


def src_path(root: str, ckpt: Checkpoint, f: SourceFile) -> str:
    """Where `f` is under `root`."""
    return f"{root}/{ckpt.name}" if ckpt.kind == "file" else f"{root}/{ckpt.name}/{f.path}"


def partial_path(root: str, ckpt: Checkpoint, f: SourceFile) -> str:
    return f"{root}/{PARTIAL_PREFIX}{ckpt.name}/{f.path}"


def repair_path(final: str) -> str:
    head, tail = os.path.split(final)
    return f"{head}/{REPAIR_PREFIX}{tail}"


def damaged(manifest: dict, published: Checkpoint) -> set[str]:
    """Files of a published checkpoint missing, linked, or not as its manifest says."""
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


def refuse_links(d: Dest, name: str) -> None:
    """Refuse a symlink (or an odd name) in a partial folder before writing through it."""
    odd = [(o.get("path"), o.get("why")) for o in d.scan.partial_odd.get(name, [])]
    odd += [(f.path, "is a symlink") for f in d.scan.partials.get(name, []) if f.link]
    if odd:
        path, why = odd[0]
        raise RelayError(
            f"{d.name}: {d.root}/{PARTIAL_PREFIX}{name}/{path} {why}; a "
            "partial folder holds only what the relay wrote: remove it, then "
            "relay again"
        )


def draft(
    ckpts: tuple[Checkpoint, ...] | list[Checkpoint],
    dests: tuple[Dest, ...] | list[Dest],
    *,
    verify: bool = False,
) -> Draft:
    """The checks to settle per checkpoint and destination, and the hashes they need."""
    dest_req: dict[str, dict[HashKey, dict]] = {d.name: {} for d in dests}
    stale: dict[str, list[str]] = {d.name: [] for d in dests}
    checks: list[Check] = []
    unchanged: set[tuple[str, str]] = set()
    for ckpt in ckpts:
        for d in dests:
            manifest = d.scan.manifests.get(ckpt.name)
            published = ckpt.name in d.scan.checkpoints
            if published and manifest_matches(manifest, ckpt):
                unchanged.add((ckpt.name, d.name))
                broken = damaged(manifest, d.scan.checkpoints[ckpt.name])
                hashes = {f["path"]: f.get("sha256") for f in manifest["files"]}
                for f in ckpt.files:
                    if f.path in broken:
                        checks.append(Check(ckpt, d, "repair", f))
                    elif verify:
                        key = (src_path(d.root, ckpt, f), None)
                        dest_req[d.name][key] = {"path": key[0]}
                        checks.append(Check(ckpt, d, "verify", f, 0, key, hashes[f.path]))
                continue
            if published and manifest is None:
                raise RelayError(
                    f"{d.name}: {d.root}/{ckpt.name} exists but was not "
                    "relayed by dflash (no manifest); move it away, then "
                    "relay again"
                )
            refuse_links(d, ckpt.name)
            partial = {f.path: f for f in d.scan.partials.get(ckpt.name, [])}
            names = {f.path for f in ckpt.files}
            stale[d.name] += [
                partial_path(d.root, ckpt, SourceFile(p, 0, 0)) for p in partial if p not in names
            ]
            for f in ckpt.files:
                pf = partial.get(f.path)
                have = pf.size if pf is not None else 0
                saved = 0 < have <= f.size and pf.resume > 0 and not verify
                if saved:
                    have = pf.resume
                if 0 < have <= f.size:
                    checks.append(Check(ckpt, d, "resume", f, have, saved_state=saved))
                else:
                    checks.append(Check(ckpt, d, "send", f))
    return Draft(
        ckpts=tuple(ckpts),
        dests=tuple(dests),
        unchanged=frozenset(unchanged),
        checks=tuple(checks),
        dest_requests={n: tuple(r.values()) for n, r in dest_req.items()},
        stale={n: tuple(s) for n, s in stale.items()},
    )


def decide(
    dr: Draft,
    src_dir: str,
    dest_hashes: dict[str, dict[HashKey, dict]] | None = None,
) -> Plan:
    """Settle every check of `dr` with the destinations' hash answers."""
    dest_hashes = dest_hashes or {}
    reports: dict[str, CheckpointReport] = {}
    for ckpt in dr.ckpts:
        crep = reports[ckpt.name] = CheckpointReport(
            ckpt.name, ckpt.step, ckpt.size, len(ckpt.files)
        )
        for d in dr.dests:
            st = crep.destinations[d.name] = DestStatus(d.name)
            if (ckpt.name, d.name) in dr.unchanged:
                st.status = "unchanged"
                st.bytes_skipped = ckpt.size
    need = {d.name: 0 for d in dr.dests}
    targets: dict[tuple[str, str], tuple[Checkpoint, SourceFile, list[Target]]] = {}
    for c in dr.checks:
        d, f = c.dest, c.file
        st = reports[c.ckpt.name].destinations[d.name]
        answers = dest_hashes.get(d.name, {})
        if c.kind in ("verify", "repair"):
            if c.kind == "verify" and answers.get(c.dest_key, {}).get("sha256") == c.want:
                continue
            st.repaired.append(f.path)
            final = src_path(d.root, c.ckpt, f)
            target = Target(d, repair_path(final), 0, rename_to=final)
            st.bytes_skipped -= f.size
        else:
            # A resumed file at full size still streams (an empty frame): that proves it.
            offset = c.have if c.kind == "resume" else 0
            st.bytes_skipped += offset
            target = Target(d, partial_path(d.root, c.ckpt, f), offset, None, c.saved_state)
        need[d.name] += f.size - target.offset
        st.bytes_planned += f.size - target.offset
        entry = targets.setdefault((c.ckpt.name, f.path), (c.ckpt, f, []))
        entry[2].append(target)
    plans = []
    for ckpt in dr.ckpts:
        crep = reports[ckpt.name]
        for st in crep.destinations.values():
            if st.status == "pending":
                st.status = "planned"
        tasks = tuple(
            FileTask(ck, f, src_path(src_dir, ck, f), tuple(ts))
            for (name, _), (ck, f, ts) in targets.items()
            if name == ckpt.name
        )
        plans.append(CheckpointPlan(ckpt, crep, tasks))
    return Plan(tuple(plans), need, dr.stale)


def check_space(plan: Plan, dests: tuple[Dest, ...] | list[Dest]) -> None:
    """Refuse, before a byte moves, a plan that does not fit a destination's reserve."""
    for d in dests:
        need = plan.need.get(d.name, 0)
        room = d.scan.free - d.reserve
        if need > room:
            raise RelayError(
                f"{d.name}: not enough space in {d.root}: this relay needs "
                f"{human_bytes(need)} more, {human_bytes(d.scan.free)} is free and "
                f"{human_bytes(d.reserve)} must stay free (reserve), short by "
                f"{human_bytes(need - room)}; free space there, use --keep, or lower the "
                "reserve"
            )
