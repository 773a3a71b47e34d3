"""A relay as the command line asks for it, with the inventory's defaults filled in."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import DflashError
from orchestrator.inventory import Inventory
from orchestrator.relay.run import RelayIncomplete, RelayOptions, RelayReport
from orchestrator.sizes import parse_size


@dataclass
class RelayRequest:
    inventory: Inventory
    source: str
    dests: list[str]
    options: RelayOptions


def _split(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]


def relay_request(
    inventory: Inventory,
    source: str | None = None,
    dests: list[str] | None = None,
    names: list[str] | None = None,
    *,
    step: int | None = None,
    latest: bool = False,
    all_: bool = False,
    src_dir: str | None = None,
    dest_dir: str | None = None,
    verify: bool = False,
    dry_run: bool = False,
    keep: int | None = None,
    jobs: int | None = None,
    reserve: str | None = None,
) -> RelayRequest:
    """The request, with the inventory's ``relay_from``, ``relay_to`` and ``keep`` as
    defaults; at most one selection."""
    src = source or inventory.defaults.relay_from
    to = _split(dests) or _split([inventory.defaults.relay_to or ""])
    if not src:
        raise DflashError("no source: pass --from HOST or set defaults.relay_from in the inventory")
    if sum(bool(x) for x in (names, step is not None, latest, all_)) > 1:
        raise DflashError("choose one of CHECKPOINT names, --step, --latest or --all")
    options = RelayOptions(
        names=list(names or []),
        step=step,
        latest=latest,
        all=all_,
        src_dir=src_dir,
        dest_dir=dest_dir,
        verify=verify,
        dry_run=dry_run,
        keep=keep if keep is not None else inventory.defaults.keep,
        jobs=jobs,
        reserve=parse_size(reserve) if reserve is not None else None,
    )
    return RelayRequest(inventory, src, to, options)


def raise_if_incomplete(report: RelayReport) -> None:
    """`RelayIncomplete` when a named checkpoint was skipped or a transfer failed."""
    if report.skipped_named and not report.failures:
        first = report.skipped_named[0]
        more = (
            f" (and {len(report.skipped_named) - 1} more)" if len(report.skipped_named) > 1 else ""
        )
        raise RelayIncomplete(f"{first['name']} was not relayed: {first['reason']}{more}")
    if not report.ok:
        name, host, error = report.failures[0]
        more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
        raise RelayIncomplete(
            f"relay of {name} to {host} failed: {error}{more}; rerun to resume from what arrived"
        )
