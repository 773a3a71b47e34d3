"""`probe_structure`: ask a host what a model really is (the remote ``probe`` command).

The controller never imports torch: the remote bundle builds the model on the host's meta
device and answers with one JSON document (schema ``dflash.probe/1``), returned here as a
dict. `resolve_model` picks the model path from the inventory when none is given.
"""

from __future__ import annotations

from orchestrator.errors import DflashError
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import PROBE_SCHEMA

SCHEMA = PROBE_SCHEMA
DEFAULT_DEPTH = 4


def resolve_model(spec: HostSpec, model_path: str | None) -> str:
    """The model to probe: `model_path`, else the host's eval-role ``target_model``."""
    if model_path:
        return model_path
    if spec.eval is not None and spec.eval.target_model:
        return spec.eval.target_model
    raise DflashError(
        f"no --model given and host {spec.name!r} has no eval role with a "
        "target_model in the inventory"
    )


def probe_structure(
    host: Host,
    model_path: str,
    drafter: str | None = None,
    load: bool = False,
    depth: int = DEFAULT_DEPTH,
    timeout: float | None = None,
) -> dict:
    """Run ``probe`` on `host` and return its report.

    A remote user error (missing folder, unknown model_type, truncated shard) arrives as a
    one-line `RemoteCommandError`; a report in another schema is refused rather than
    misread.
    """
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
    host_name: str,
    model_path: str | None = None,
    drafter: str | None = None,
    load: bool = False,
    depth: int = DEFAULT_DEPTH,
) -> dict:
    """`probe_structure` on the inventory's host `host_name`, of `model_path` or else the
    host's eval-role ``target_model`` (``dflash probe-structure``)."""
    spec = inventory.host(host_name)
    model = resolve_model(spec, model_path)
    with open_host(spec, inventory) as host:
        return probe_structure(host, model, drafter=drafter, load=load, depth=depth)


def probe_failed(report: dict) -> bool:
    """Whether the report found a problem: a drafter that does not fit, or a load whose
    hidden states were wrong."""
    drafter_bad = report.get("drafter") and not report["drafter"]["ok"]
    load_bad = report.get("load") and not report["load"]["ok"]
    return bool(drafter_bad or load_bad)
