"""``dflash relay``: checkpoints from a trainer to eval hosts through this machine.

`relay` walks the rooms of the relay in order, per checkpoint and destination:

1. **Look** (`session`, no payload): the trainer's folder is scanned and each checkpoint
   judged complete or not (`checkpoints`); each destination's folder is locked for this
   relay (a second relay into it is refused, naming the holder) and scanned for published
   checkpoints (their ``.dflash-manifest.json``), partial folders and free space.
2. **Select** (`selection`): the checkpoints asked for, or the newest complete one.
3. **Plan** (`plan`, pure): skip what is already there (a published checkpoint whose
   manifest lists the same files, sizes and mtimes costs 0 payload bytes; with ``verify``
   its files are re-hashed ON the destination and a damaged one is sent again), resume
   partial files where they end (the whole file's hash on both hosts proves the kept
   prefix; a mismatch is sent again from 0), and refuse before moving a
   byte when a destination lacks the space still needed (free bytes minus its reserve).
4. **Send** (`transfer`): batches of files, one stream per host per batch, each file read
   once and written to every destination, sha256 checked on both ends.
5. **Publish** (`publish`): manifest and ONE rename per checkpoint and destination; with
   ``keep``, only the newest K relayed checkpoints stay on each destination.

`report` holds what it tells: `RelayReport` at the end, `Progress` while it runs.
"""

from __future__ import annotations

import os
import time
from typing import Any

from orchestrator.inventory import Inventory
from orchestrator.relay import plan, publish
from orchestrator.relay.options import RELAY_PYTHON_FLAGS, RelayOptions, default_jobs
from orchestrator.relay.report import (
    CheckpointReport,
    DestStatus,
    Progress,
    RelayError,
    RelayIncomplete,
    RelayReport,
)
from orchestrator.relay.selection import destination_state, select
from orchestrator.relay.session import Session
from orchestrator.relay.transfer import Transfer, batches
from orchestrator.transport.hosts import quote


def _mux_wanted() -> bool:
    """Commands and streams share one ssh master per host unless ``DFLASH_RELAY_MUX=0``
    (a fallback for an ssh without ControlMaster)."""
    return os.environ.get("DFLASH_RELAY_MUX", "1") != "0"


def relay(
    inventory: Inventory,
    source: str,
    destinations: list[str],
    options: RelayOptions | None = None,
    progress: Progress | None = None,
) -> RelayReport:
    """Relay checkpoints from `source` to every host in `destinations` (see module doc).

    Returns a report; destinations that failed are marked in it (``report.ok`` is False)
    and keep their partial folders for the next run. Raises `RelayError` before moving a
    byte when the selection is empty or a destination lacks space. On Ctrl-C, every stream
    is ended and the partial data stays for the next relay to resume.
    """
    options = options or RelayOptions()
    progress = progress or Progress()
    t0 = time.monotonic()
    live = not options.dry_run
    with Session(
        inventory, source, destinations, options, lock=live, mux=_mux_wanted(), ahead=live
    ) as s:
        report = RelayReport(s.src.name, s.src_dir, s.roots, dry_run=options.dry_run)
        chosen = select(s.src_scan, s.where, options)
        report.incomplete += chosen.skipped
        draft = plan.draft(chosen.checkpoints, s.dests, verify=options.verify)
        the_plan = plan.decide(draft, s.src_dir, s.hash_all(draft))
        report.checkpoints += [cp.report for cp in the_plan.checkpoints]
        plan.check_space(the_plan, s.dests)
        if live:
            sender = Transfer(
                inventory,
                s.src,
                s.hosts,
                mux=s.mux,
                jobs=options.jobs,
                progress=progress,
                spares=s.spares,
                receivers=s.receivers,
                stall=options.stall,
            )
            try:
                progress.start(the_plan.total_bytes, the_plan.total_files)
                sender.clear_stale(the_plan.stale)
                for cp in the_plan.checkpoints:
                    sender.run(cp)
                    publish.finish_checkpoint(
                        cp,
                        s.dests,
                        s.ask,
                        source=s.src.name,
                        src_dir=s.src_dir,
                        sent=sender.hashes,
                        verify=options.verify,
                    )
                if options.keep is not None:
                    report.pruned = publish.prune(s.dests, s.hosts, s.ask, options.keep)
            except KeyboardInterrupt:
                sender.cancel()
                raise
            report.bytes_read = sender.bytes_read
        report.seconds = time.monotonic() - t0
        return report


def list_checkpoints(
    inventory: Inventory, source: str, destinations: list[str], options: RelayOptions | None = None
) -> dict[str, Any]:
    """What exists on the source, whether complete, and where it is already relayed:
    ``relayed`` (manifest matches the source), ``stale`` (relayed, source changed since),
    ``partial`` (bytes there of the total) or ``no``."""
    options = options or RelayOptions()
    with Session(
        inventory, source, destinations, options, lock=not options.dry_run, mux=_mux_wanted()
    ) as s:
        rows = [
            {
                "name": c.name,
                "step": c.step,
                "kind": c.kind,
                "files": len(c.files),
                "size": c.size,
                "complete": c.complete,
                "reason": c.reason,
                "destinations": {d.name: destination_state(c, d.scan) for d in s.dests},
            }
            for c in s.src_scan.everything
        ]
        return {
            "source": s.src.name,
            "source_dir": s.src_dir,
            "destinations": s.roots,
            "checkpoints": rows,
        }


__all__ = [
    "relay",
    "list_checkpoints",
    "batches",
    "default_jobs",
    "RelayOptions",
    "RelayReport",
    "CheckpointReport",
    "DestStatus",
    "Progress",
    "RelayError",
    "RelayIncomplete",
    "RELAY_PYTHON_FLAGS",
    "quote",
]
