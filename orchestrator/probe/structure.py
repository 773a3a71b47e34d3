"""`probe_structure`: ask a host what a model really is (the remote ``probe`` command)."""

from __future__ import annotations

from orchestrator.errors import DflashError
from orchestrator.eval.run import eval_host_name
from orchestrator.eval.spec import EvalOptions, resolve_checkpoint, target_model
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import PROBE_SCHEMA

SCHEMA = PROBE_SCHEMA
DEFAULT_DEPTH = 4


def resolve_model(spec: HostSpec, model_path: str | None) -> str:
    """`model_path`, else the host's ``target_model``, resolved as an eval's target is."""
    return target_model(spec, EvalOptions(target=model_path), "--model")


def probe_structure(
    host: Host,
    model_path: str,
    drafter: str | None = None,
    load: bool = False,
    depth: int = DEFAULT_DEPTH,
    timeout: float | None = None,
) -> dict:
    """Run ``probe`` on `host` and return its report; one in another schema is refused."""
    # option=value: a path starting with "-" is then a value, not an option
    argv = ["probe", f"--model={model_path}", f"--depth={depth}"]
    if drafter:
        argv += [f"--drafter={drafter}"]
    if load:
        argv.append("--load")
    report = bundle.run_remote_json(host, argv, timeout=timeout)
    if report.get("schema") != SCHEMA:
        raise DflashError(
            f"{host.name}: probe answered schema {report.get('schema')!r}, "
            f"expected {SCHEMA!r}: the bundle and controller disagree"
        )
    return report


def probe_on(
    inventory: Inventory,
    host_name: str | None,
    model_path: str | None = None,
    drafter: str | None = None,
    load: bool = False,
    depth: int = DEFAULT_DEPTH,
) -> dict:
    """``dflash probe-structure``: the host, model and drafter resolved as ``remote-eval``
    resolves them."""
    spec = inventory.host(eval_host_name(inventory, host_name))
    model = resolve_model(spec, model_path)
    with open_host(spec, inventory) as host:
        where = resolve_checkpoint(host, spec, drafter) if drafter else None
        return probe_structure(host, model, drafter=where, load=load, depth=depth)


def probe_failed(report: dict) -> bool:
    """Whether the drafter does not fit or the load's hidden states were wrong."""
    drafter_bad = report.get("drafter") and not report["drafter"]["ok"]
    load_bad = report.get("load") and not report["load"]["ok"]
    return bool(drafter_bad or load_bad)
