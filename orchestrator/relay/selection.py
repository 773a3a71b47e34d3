"""Which checkpoints a relay takes (names, a step, all, else the newest complete one), and
what ``--list`` says of each (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.relay.checkpoints import Checkpoint, Scan, by_step
from orchestrator.relay.options import RelayOptions
from orchestrator.relay.report import RelayError
from remote.protocol import MANIFEST_FORMAT


@dataclass(frozen=True)
class Selection:
    """The checkpoints to relay, and those chosen but skipped (incomplete)."""

    checkpoints: tuple[Checkpoint, ...]
    skipped: tuple[dict, ...] = ()


def select(src_scan: Scan, where: str, options: RelayOptions) -> Selection:
    """Choose from `src_scan` (of `where`) what `options` asks for, or `RelayError`."""
    ckpts = src_scan.checkpoints
    o = options
    if o.names:
        chosen = []
        for name in o.names:
            name = name.rstrip("/")
            found = ckpts.get(name) or src_scan.unnamed.get(name)  # as --list shows it
            if found is None:
                have = ", ".join(sorted(ckpts)[-8:]) or "none"
                raise RelayError(f"no checkpoint {name!r} in {where} (have: {have})")
            chosen.append(found)
    elif o.step is not None:
        chosen = [c for c in src_scan.everything if c.step == o.step]
        if not chosen:
            steps = sorted({c.step for c in ckpts.values() if c.step is not None})
            raise RelayError(
                f"no checkpoint for step {o.step} in {where} (steps there: "
                f"{', '.join(map(str, steps[-8:])) or 'none'})"
            )
    elif o.all:
        chosen = src_scan.everything
    else:
        done = [c for c in ckpts.values() if c.complete]
        if not done:
            raise RelayError(
                f"no complete checkpoint in {where} "
                f"({len(ckpts)} there, none finished); see dflash relay "
                "--list"
            )
        chosen = [max(done, key=by_step)]
    named = bool(o.names) or o.step is not None
    return Selection(
        checkpoints=tuple(c for c in chosen if c.complete),
        skipped=tuple(
            {"name": c.name, "step": c.step, "reason": c.reason, "named": named}
            for c in chosen
            if not c.complete
        ),
    )


def manifest_matches(manifest: dict | None, ckpt: Checkpoint) -> bool:
    """Whether a destination's manifest lists exactly `ckpt`'s files, sizes and mtimes."""
    if not manifest or manifest.get("format") != MANIFEST_FORMAT:
        return False
    try:
        listed = sorted(
            (f["path"], int(f["size"]), round(float(f["mtime"]), 3)) for f in manifest["files"]
        )
    except (KeyError, TypeError, ValueError):
        return False
    return listed == ckpt.signature()


def destination_state(ckpt: Checkpoint, dest: Scan) -> str:
    """``relayed``, ``stale``, ``partial H/T`` or ``no``: `ckpt` on a destination."""
    if ckpt.name in dest.checkpoints and ckpt.name in dest.manifests:
        return "relayed" if manifest_matches(dest.manifests[ckpt.name], ckpt) else "stale"
    if ckpt.name in dest.partials:
        have = sum(f.size for f in dest.partials[ckpt.name])
        return f"partial {have}/{ckpt.size}"
    return "no"
