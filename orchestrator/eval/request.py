"""A remote eval as the command line asks for it, checked before anything connects."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.eval.run import eval_host_name
from orchestrator.eval.spec import EvalOptions, ground_truth_note
from orchestrator.inventory import HostSpec, Inventory


@dataclass
class EvalRequest:
    """One eval on `host` (maybe `detach`ed) or across `hosts`; `notes`: defaults it takes."""

    inventory: Inventory
    checkpoint: str
    options: EvalOptions
    host: str | None = None
    hosts: list[str] = field(default_factory=list)
    detach: bool = False
    notes: list[str] = field(default_factory=list)


def eval_request(
    inventory: Inventory,
    checkpoint: str,
    options: EvalOptions | None = None,
    *,
    host: str | None = None,
    hosts: str | None = None,
    detach: bool = False,
) -> EvalRequest:
    """The request: sharded across `hosts` (comma-separated), else on `host` or the default."""
    options = options or EvalOptions()
    if hosts:
        if host or detach:
            raise DflashError(
                "--hosts runs a sharded eval to the end; it does not combine "
                "with --host or --detach"
            )
        names = [n.strip() for n in hosts.split(",") if n.strip()]
        first = inventory.expand(names)[:1]  # it makes the ground truth
        return EvalRequest(
            inventory, checkpoint, options, hosts=names, notes=_notes(first, options)
        )
    name = eval_host_name(inventory, host)
    notes = _notes([inventory.host(name)], options)
    return EvalRequest(inventory, checkpoint, options, host=name, detach=detach, notes=notes)


def _notes(specs: list[HostSpec], options: EvalOptions) -> list[str]:
    return [n for n in (ground_truth_note(s, options) for s in specs) if n]
