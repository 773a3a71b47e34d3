"""``dflash online``: a serving engine's tau beside the offline one, a verdict (docs/online.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import run
from orchestrator.eval.job import EventHandler, JobRef, start_job
from orchestrator.eval.outline import outline_event
from orchestrator.eval.pull import warm_plots
from orchestrator.eval.run import eval_host_name
from orchestrator.eval.spec import EvalOptions, build_spec
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.transport.hosts import Host, open_host
from remote.online.spec import (
    ENGINES,
    MeasureSpec,
    ServeError,
    ServeSpec,
    parse_concurrency,
    sampled_problem,
)
from remote.online.verdict_doc import check_verdict_bytes
from remote.protocol import JobKind, ResultError

ONLINE_FILES = ("result.json", "verdict.json")
SETUP_HINT = (
    "set roles.eval.serve: {engine: vllm, python: /path/to/vllm-venv/bin/python} in the "
    "inventory (bash scripts/setup-vllm.sh builds such a venv), or pass --server URL of a "
    "server already running with the drafter loaded"
)


@dataclass
class OnlineOptions:
    """One online measurement: the eval's options (no DDTree) and the serving engine, a
    running `server` or the inventory's; the options' meanings: docs/online.md."""

    eval: EvalOptions = field(default_factory=EvalOptions)
    server: str | None = None
    engine: str | None = None
    model: str | None = None
    concurrency: tuple[int, ...] | str = (1,)
    baseline: bool = False
    baseline_server: str | None = None

    def __post_init__(self) -> None:
        if self.engine is not None and self.engine not in ENGINES:
            raise DflashError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.server is not None:
            self.serve_spec(None)  # a bad URL is refused before anything connects
        try:
            if isinstance(self.concurrency, str):
                self.concurrency = parse_concurrency(self.concurrency)
            if self.baseline_server is not None:
                MeasureSpec(baseline_url=self.baseline_server)
        except ServeError as exc:
            raise DflashError(str(exc).replace("baseline url", "--baseline-server", 1)) from None
        if self.baseline and self.baseline_server is not None:
            raise DflashError("--baseline starts a server; --baseline-server names a running one")

    def measure_spec(self, role: ServeSpec | None, host: str = "the eval host") -> MeasureSpec:
        """How the job measures: the concurrency levels and the baseline."""
        python = None
        if self.baseline:
            python = role.python if role is not None else None
            if python is None:
                raise DflashError(
                    f"--baseline starts vLLM without the drafter with host {host}'s "
                    "roles.eval.serve.python, which the inventory does not set; set it, or "
                    "pass --baseline-server URL of a server already running without the drafter"
                )
        return MeasureSpec(
            concurrency=tuple(self.concurrency),
            baseline_python=python,
            baseline_url=self.baseline_server,
        )

    def serve_spec(self, role: ServeSpec | None, host: str = "the eval host") -> ServeSpec:
        """The serving engine: `server` (under the role's timeouts, which hold for any server),
        else the inventory's `role`."""
        try:
            if self.server is not None:
                engine = self.engine or (role.engine if role else "vllm")
                bounds = {}
                if role is not None:
                    bounds = {
                        "start_timeout": role.start_timeout,
                        "request_timeout": role.request_timeout,
                    }
                return ServeSpec(engine=engine, url=self.server, model=self.model, **bounds)
            if role is None:
                raise DflashError(f"no serving engine for host {host}: {SETUP_HINT}")
            if self.engine not in (None, role.engine):
                raise DflashError(
                    f"--engine {self.engine} says what --server URL is; host {host}'s "
                    f"inventory serves with {role.engine} (roles.eval.serve.engine)"
                )
            return replace(role, model=self.model or role.model)
        except ServeError as exc:
            raise DflashError(str(exc).replace("serve.url", "--server", 1)) from None


def online_job(host: Host, spec: HostSpec, checkpoint: str, options: OnlineOptions) -> dict:
    """The ``online`` job spec: an eval's, chain walk only, the engine under ``serve``."""
    role = spec.eval.serve if spec.eval else None
    serve = options.serve_spec(role, spec.name)
    eo = options.eval
    eo = replace(eo, engine=replace(eo.engine, budgets=()))
    job = build_spec(host, spec, checkpoint, eo, carry=[])
    job["kind"] = JobKind.ONLINE
    job["serve"] = serve.to_json()
    job["measure"] = options.measure_spec(role, spec.name).to_json()
    return job


def run_online(
    inventory: Inventory,
    host_name: str | None,
    checkpoint: str,
    options: OnlineOptions | None = None,
    *,
    on_event: EventHandler | None = None,
    dest: str | os.PathLike | None = None,
    on_start: Callable[[JobRef], None] | None = None,
) -> Path:
    """Measure `checkpoint` online on the eval host; its run folder ``<results_dir>/<job-id>``."""
    options = options or OnlineOptions()
    name = eval_host_name(inventory, host_name)
    spec = inventory.host(name)
    serve = options.serve_spec(spec.eval.serve if spec.eval else None, name)
    measure = options.measure_spec(spec.eval.serve if spec.eval else None, name)
    problem = sampled_problem(options.eval.temperature, serve.engine, measure)
    if problem:
        raise DflashError(problem)
    with open_host(spec, inventory) as host:
        host.connect()
        warm_plots()
        job = online_job(host, spec, checkpoint, options)
        ref = start_job(host, job, preflight=True, follow=True)
        if on_start:
            on_start(ref)
        if on_event:
            on_event(outline_event(ref.spec, f"online job {ref.job_id} on {name}"))
        return attach(inventory, name, ref.job_id, on_event=on_event, dest=dest, host=host, ref=ref)


def check_online_files(files: dict[str, bytes]) -> None:
    """What an online job's pull must hold beyond an eval's: its verdict, checked."""
    if "verdict.json" not in files:
        raise ResultError("verdict.json is missing")
    check_verdict_bytes(files["verdict.json"])


def attach(
    inventory: Inventory,
    host_name: str | None,
    job_id: str,
    *,
    on_event: EventHandler | None = None,
    dest: str | os.PathLike | None = None,
    host: Host | None = None,
    ref: JobRef | None = None,
    status: dict | None = None,
) -> Path:
    """`run.attach` for an online job, its verdict checked before anything is written."""
    return run.attach(
        inventory,
        host_name,
        job_id,
        on_event=on_event,
        dest=dest,
        host=host,
        ref=ref,
        status=status,
        what="online job",
        required=ONLINE_FILES,
        check=check_online_files,
    )
