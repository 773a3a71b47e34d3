"""Finishing on the destinations: publish, repair, keep (docs/relay.md, "Atomicity")."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any

from orchestrator.relay.checkpoints import Checkpoint, by_step, parse_scan
from orchestrator.relay.plan import CheckpointPlan, Dest, Target
from orchestrator.transport.hosts import Host
from remote.protocol import MANIFEST, MANIFEST_FORMAT

Ask = Callable[[str, dict], dict]  # (destination, request) -> answer


def manifest(ckpt: Checkpoint, source: str, src_dir: str, hashes: dict[str, str]) -> dict:
    """The manifest of `ckpt` with each file's sha256 as verified on the destination."""
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
    """Settle one checkpoint on every destination not failed; a failure fails only that one."""
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
        except Exception as exc:
            st.status = "failed"
            st.error = f"publish {ckpt.name}: {exc}"


def put_repaired(host: Host, t: Target) -> None:
    # -T: a symlink planted at the final name is replaced, never moved into
    host.run(["mv", "-f", "-T", "--", t.write_path, t.rename_to])


def prune(dests: list[Dest], hosts: dict[str, Host], ask: Ask, keep: int) -> dict[str, list[Any]]:
    """Keep the newest `keep` relayed checkpoints per destination; what went, by host."""
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
