"""``dflash relay``: look (`session`), select, plan, send (`transfer`), publish, in order."""

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
    """Commands and streams share one ssh master per host unless ``DFLASH_RELAY_MUX=0``."""
    return os.environ.get("DFLASH_RELAY_MUX", "1") != "0"


def relay(
    inventory: Inventory,
    source: str,
    destinations: list[str],
    options: RelayOptions | None = None,
    progress: Progress | None = None,
) -> RelayReport:
    """Relay checkpoints from `source` to every destination; `RelayError` before a byte
    moves when nothing is selected or space lacks; failures are in the report."""
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
    """What the source holds, whether complete, and where it is already relayed."""
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
