"""A remote eval as the command line asks for it: the checkpoint, where (the eval host, or
several hosts to shard across), how, and whether to wait for its end. What `run.run_eval`,
`run.start_eval` and `shard.run_sharded` take, with the inventory's default host filled in
and the combinations no eval can run refused in one line, before anything connects."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.eval.run import eval_host_name
from orchestrator.eval.spec import EvalOptions
from orchestrator.inventory import Inventory


@dataclass
class EvalRequest:
    """One eval: on `host` (then `detach`: start it and return), or sharded across `hosts`
    (names or groups; then `host` is None)."""

    inventory: Inventory
    checkpoint: str
    options: EvalOptions
    host: str | None = None
    hosts: list[str] = field(default_factory=list)
    detach: bool = False


def eval_request(
    inventory: Inventory,
    checkpoint: str,
    options: EvalOptions | None = None,
    *,
    host: str | None = None,
    hosts: str | None = None,
    detach: bool = False,
) -> EvalRequest:
    """The request: `hosts` (comma-separated names or groups) shards the eval, which runs to
    its end on no host in particular; otherwise it runs on `host`, default the inventory's
    eval host (`run.eval_host_name`)."""
    options = options or EvalOptions()
    if hosts:
        if host or detach:
            raise DflashError(
                "--hosts runs a sharded eval to the end; it does not combine "
                "with --host or --detach"
            )
        names = [n.strip() for n in hosts.split(",") if n.strip()]
        return EvalRequest(inventory, checkpoint, options, hosts=names)
    name = eval_host_name(inventory, host)
    return EvalRequest(inventory, checkpoint, options, host=name, detach=detach)
