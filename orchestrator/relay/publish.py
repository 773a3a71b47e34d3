"""Finishing on the destinations: publish a checkpoint, put a repaired file in place, prune.

- **Publish**: when every file of a checkpoint is verified on a destination, its manifest
  (files, sizes, mtimes, sha256, where it came from) is written into the partial folder
  and the folder renamed to its final name by the destination's lock holder (the
  ``relay-publish`` step, asked on its open channel: no new session): ONE rename, so an eval
  never sees half a checkpoint (the host refuses to publish if any file of the manifest
  is missing or short). A failed destination keeps its partial folder (the next relay
  resumes it) and does not stop the others.
- **Repair**: a damaged file of a published checkpoint was sent into a hidden temp file
  beside it, renamed over it once verified.
- **Keep**: only the newest K relayed checkpoints (by step) stay on each destination;
  folders not relayed by dflash (no manifest) are never touched.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any

from orchestrator.relay.checkpoints import Checkpoint, by_step, parse_scan
from orchestrator.relay.plan import CheckpointPlan, Dest, Target
from orchestrator.transport.hosts import Host
from remote.protocol import MANIFEST, MANIFEST_FORMAT

Ask = Callable[[str, dict], dict]  # (destination, request) -> its lock holder's answer


def manifest(ckpt: Checkpoint, source: str, src_dir: str, hashes: dict[str, str]) -> dict:
    """The manifest of `ckpt` as relayed from `source`:`src_dir`, with the sha256 of each
    file as verified on the destination (`hashes`, by path)."""
    return {
        "format": MANIFEST_FORMAT,
        "checkpoint": ckpt.name,
        "kind": ckpt.kind,
        "step": ckpt.step,
        "source": {"host": source, "path": f"{src_dir}/{ckpt.name}"},
        "relayed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "size": ckpt.size,
        "files": [
            {
                "path": f.path,
                "size": f.size,
                "sha256": hashes[f.path],
                "mtime": f.mtime,
                **({"link": True} if f.link else {}),
            }
            for f in ckpt.files
        ],
    }


def finish_checkpoint(
    cp: CheckpointPlan,
    dests: list[Dest],
    ask: Ask,
    *,
    source: str,
    src_dir: str,
    sent: dict[tuple[str, str], dict[str, str]],
    verify: bool = False,
) -> None:
    """Settle one checkpoint on every destination not failed: an unchanged one becomes
    ``repaired`` or ``verified`` (when so), a sent one is published (``relayed``).
    `sent`: the sha256 of the files the transfer verified, by (checkpoint, host); `ask`
    puts a request to a destination's lock holder (`Session.ask`)."""
    ckpt = cp.ckpt
    for d in dests:
        st = cp.report.destinations[d.name]
        if st.status == "failed":
            continue
        try:
            if st.status == "unchanged":
                if st.repaired:
                    st.status = "repaired"
                elif verify:
                    st.status = "verified"
                continue
            hashes = sent.get((ckpt.name, d.name), {})
            ask(
                d.name,
                {
                    "op": "publish",
                    "name": ckpt.name,
                    "kind": ckpt.kind,
                    "manifest": manifest(ckpt, source, src_dir, hashes),
                },
            )
            st.status = "relayed"
        except Exception as exc:  # one destination failing must not stop the others
            st.status = "failed"
            st.error = f"publish {ckpt.name}: {exc}"


def put_repaired(host: Host, t: Target) -> None:
    """Rename a verified repair temp file over the damaged published file."""
    # -T: a symlink (to a folder) planted at the final name is replaced, never moved into
    host.run(["mv", "-f", "-T", "--", t.write_path, t.rename_to])


def prune(dests: list[Dest], hosts: dict[str, Host], ask: Ask, keep: int) -> dict[str, list[Any]]:
    """Keep the newest `keep` relayed checkpoints on each destination, remove the older
    ones; returns what went per destination (or one line why it was not pruned)."""
    pruned: dict[str, list[Any]] = {}
    for d in dests:
        host = hosts[d.name]
        try:
            now = parse_scan(d.root, ask(d.name, {"op": "scan"}).get("scan"), d.name)
        except Exception as exc:
            pruned[d.name] = [f"(not pruned: {exc})"]
            continue
        relayed = [c for c in now.checkpoints.values() if c.name in now.manifests]
        relayed.sort(key=by_step, reverse=True)
        gone = relayed[keep:]
        for c in gone:
            path = f"{d.root}/{c.name}"
            extra = [f"{d.root}/.{c.name}{MANIFEST}"] if c.kind == "file" else []
            host.run(["rm", "-rf", "--", path, *extra])
        pruned[d.name] = [c.name for c in gone]
    return pruned
