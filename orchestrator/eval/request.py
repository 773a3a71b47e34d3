"""A remote eval as the command line asks for it, checked before anything connects."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.eval.run import eval_host_name
from orchestrator.eval.spec import EvalOptions, ground_truth_note
from orchestrator.inventory import HostSpec, Inventory
from remote.protocol import SpecError


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
        _check_sampling(inventory.expand(names), options)
        first = inventory.expand(names)[:1]  # it makes the ground truth
        return EvalRequest(
            inventory, checkpoint, options, hosts=names, notes=_notes(first, options)
        )
    name = eval_host_name(inventory, host)
    _check_sampling([inventory.host(name)], options)
    notes = _notes([inventory.host(name)], options)
    return EvalRequest(inventory, checkpoint, options, host=name, detach=detach, notes=notes)


def _check_sampling(specs: list[HostSpec], options: EvalOptions) -> None:
    """The sampling each host's job will take (its role's defaults under the flags),
    refused in one line before anything connects."""
    for spec in specs:
        try:
            options.check_policy(options.sampling(1, spec.eval))
        except SpecError as exc:
            raise DflashError(f"{spec.name}: {exc}") from None


def _notes(specs: list[HostSpec], options: EvalOptions) -> list[str]:
    return [n for n in (ground_truth_note(s, options) for s in specs) if n]
