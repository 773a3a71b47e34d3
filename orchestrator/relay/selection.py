"""Which checkpoints a relay takes, and what ``--list`` says about each (pure: no I/O).

Selection, from the source's judged scan (`orchestrator.relay.checkpoints.judge_complete`):

- names: exactly those (a name the source lacks refuses the relay, listing what it has);
- ``--step N``: every checkpoint of that step (none refuses the relay);
- ``--all``: every checkpoint, oldest first;
- otherwise (``--latest``, the default): the newest complete checkpoint (none refuses).

A chosen checkpoint that is not complete is not relayed but skipped with its reason; a
skip of one asked for by name or step is ``named`` and makes the relay incomplete.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.relay.checkpoints import Checkpoint, Scan, by_step
from orchestrator.relay.options import RelayOptions
from orchestrator.relay.report import RelayError
from remote.protocol import MANIFEST_FORMAT


@dataclass(frozen=True)
class Selection:
    """The checkpoints to relay, and those chosen but skipped (report ``incomplete`` rows)."""

    checkpoints: tuple[Checkpoint, ...]
    skipped: tuple[dict, ...] = ()


def select(src_scan: Scan, where: str, options: RelayOptions) -> Selection:
    """Choose from `src_scan` (of the source folder `where`, ``host:dir``, named in errors)
    what `options` asks for; see the module docstring. Raises `RelayError` when nothing
    matches the selection."""
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
    """Whether a destination's manifest lists exactly `ckpt`'s files, sizes and mtimes
    (then the published copy is this checkpoint, unchanged since it was relayed)."""
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
    """Where `ckpt` stands on a destination (``--list``): ``relayed`` (its manifest matches
    the source), ``stale`` (relayed, the source changed since), ``partial H/T`` (H bytes
    of T in its partial folder) or ``no``."""
    if ckpt.name in dest.checkpoints and ckpt.name in dest.manifests:
        return "relayed" if manifest_matches(dest.manifests[ckpt.name], ckpt) else "stale"
    if ckpt.name in dest.partials:
        have = sum(f.size for f in dest.partials[ckpt.name])
        return f"partial {have}/{ckpt.size}"
    return "no"
