"""``dflash parity``: capture on B then A, stream A's to B, compare on B (docs/parity.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import job as remote_job
from orchestrator.eval import jobwire, pull
from orchestrator.eval.parity.check import check_hosts
from orchestrator.eval.parity.check import target_difference as target_difference
from orchestrator.eval.parity.options import ParityOptions, same_dtype
from orchestrator.eval.parity.options import parity_request as parity_request
from orchestrator.eval.parity.options import parse_layers as parse_layers
from orchestrator.eval.parity.stream import capture_files, copy_ground_truth, stream_folder
from orchestrator.eval.spec import build_spec, new_job_id, resolve_checkpoint, target_model
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.results import parity_view
from orchestrator.results.store import results_dir
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import (
    JOB_EVAL_KEY,
    PARTIAL_PREFIX,
    TERMINAL_STATES,
    EvalSpec,
    JobKind,
    JobState,
)

INBOX = PARTIAL_PREFIX + "parity-a"  # relay-recv writes only under a partial folder
CAPTURE_MAX = 64 << 20  # a capture's result.json: its settings, file list and sample list
FROM_B = "(host B's ground truth, copied after its capture)"  # A's, when it is checked

EventHandler = Callable[[str, dict], None]  # (stage, event)


def _capture_engine(
    host: Host, spec: HostSpec, opts: ParityOptions, side: str, drafter: str | None
) -> EvalSpec:
    """Side `side`'s EvalSpec, resolved over the host's role as an eval's (a drafter on B only)."""
    eo = opts.eval_options(side)
    target = host.expand(target_model(spec, eo, f"--model-{side}"))
    return replace(eo.engine_for(spec.eval), target=target, drafter=drafter or "")


def _capture_spec(
    host: Host,
    spec: HostSpec,
    opts: ParityOptions,
    side: str,
    engine: EvalSpec,
    ground_truth_file: str | None = None,
) -> dict:
    """A ``parity-capture`` job spec resolved as an eval's (`ground_truth_file`: B's, whole)."""
    eo = opts.eval_options(side)
    job = build_spec(host, spec, f"parity-{side}", eo, engine=engine, exact_file=ground_truth_file)
    job.update(
        kind=JobKind.CAPTURE,
        layers=opts.layers,
        topk=opts.topk,
        attn=opts.attn_a if side == "a" else opts.attn_b,
    )
    return job


def _run_job(
    host: Host,
    job: dict,
    stage: str,
    on_event: EventHandler | None,
    on_start: Callable[[str, remote_job.JobRef], None] | None,
) -> dict:
    """Start a job, watch it to its end; its status (raises one line unless done)."""
    ref = remote_job.start_job(host, job, new_job_id(job["checkpoint"]))
    if on_start:
        on_start(stage, ref)
    end = remote_job.watch(host, ref.job_id, (lambda ev: on_event(stage, ev)) if on_event else None)
    if end["state"] != JobState.DONE:
        raise remote_job.failure(f"{stage} job", ref.job_id, host.name, end)
    return remote_job.job_status(host, ref.job_id)


def _result(host: Host, job_dir: str) -> dict:
    data = jobwire.fetch(host, f"{job_dir}/result.json", "a capture's result.json", CAPTURE_MAX)
    try:
        out = json.loads(data)
    except ValueError:
        raise DflashError(f"{host.name}: {job_dir}/result.json is not JSON") from None
    if not isinstance(out, dict):
        raise DflashError(f"{host.name}: {job_dir}/result.json is not a JSON object")
    return out


def run_parity(
    inventory: Inventory,
    host_a: str,
    host_b: str,
    options: ParityOptions | None = None,
    *,
    on_event: EventHandler | None = None,
    dest: str | Path | None = None,
    on_start: Callable[[str, remote_job.JobRef], None] | None = None,
) -> Path:
    """Capture on B, then on A over B's ids, stream A's to B, compare on B; the run folder."""
    opts = options or ParityOptions()
    if host_a == host_b:
        raise DflashError("parity compares two hosts; name two different ones")
    spec_a, spec_b = inventory.host(host_a), inventory.host(host_b)
    opts = same_dtype(opts, spec_b)
    with open_host(spec_a, inventory) as a, open_host(spec_b, inventory) as b:
        engine_b = _capture_engine(b, spec_b, opts, "b", None)
        engine_a = _capture_engine(a, spec_a, opts, "a", None)
        bundle.ensure(a)
        bundle.ensure(b)
        drafter = resolve_checkpoint(b, spec_b, opts.drafter) if opts.drafter else None
        if drafter and not b.exists(drafter):
            raise DflashError(f"drafter {drafter} does not exist on {host_b}")
        engine_b = replace(engine_b, drafter=drafter or "")
        job_b = _capture_spec(b, spec_b, opts, "b", engine_b)
        pre_a = _capture_spec(a, spec_a, opts, "a", engine_a, ground_truth_file=FROM_B)
        pre_a["ground_truth"]["deferred"] = jobwire.EARLY_WAIT_SECONDS
        check_hosts(a, pre_a, b, job_b, opts)
        st_b = _run_job(b, job_b, f"capture {host_b}", on_event, on_start)
        cap_b = _result(b, st_b["dir"])
        if not isinstance(cap_b.get("layers"), list):
            raise DflashError(f"{host_b}: its capture's result.json names no layers")
        opts_a = ParityOptions(**{**opts.__dict__, "layers": cap_b["layers"]})
        job_a = _capture_spec(
            a,
            spec_a,
            opts_a,
            "a",
            engine_a,
            ground_truth_file=copy_ground_truth(b, st_b["dir"], a),
        )
        st_a = _run_job(a, job_a, f"capture {host_a}", on_event, on_start)
        cap_a = _result(a, st_a["dir"])
        if on_event:
            on_event(
                "stream",
                {"event": "phase", "phase": "stream", "files": len(cap_a.get("files") or [])},
            )
        t0 = time.time()
        sums = stream_folder(
            inventory, a, st_a["dir"], capture_files(cap_a, host_a), b, st_b["dir"], INBOX
        )
        stream_s = time.time() - t0
        compare = {
            "kind": JobKind.COMPARE,
            "created": time.time(),
            "host": host_b,
            "checkpoint": "parity",
            "workdir": b.workdir,
            "capture_a": f"{st_b['dir']}/{INBOX}",
            "capture_b": st_b["dir"],
            JOB_EVAL_KEY: replace(engine_b, threads=None).to_json(),
            "host_a": host_a,
            "jobs": {"a": st_a["job_id"], "b": st_b["job_id"]},
        }
        st_c = _run_job(b, compare, f"compare on {host_b}", on_event, on_start)
        run_dir = pull.pull_results(b, st_c["job_id"], results_dir(inventory, dest))
    annotate(run_dir, host_a, host_b, opts, sums, stream_s)
    return finish_local(run_dir)


def attach(
    inventory: Inventory,
    host_name: str,
    job_id: str,
    *,
    on_event: EventHandler | None = None,
    dest: str | Path | None = None,
    host: Host | None = None,
    status: dict | None = None,
) -> Path:
    """Watch a parity compare job to its end and pull its result; a capture job is not
    resumed alone (its partner's part would be missing)."""
    if host is None:
        with open_host(inventory.host(host_name), inventory) as host:
            return attach(inventory, host_name, job_id, on_event=on_event, dest=dest, host=host)
    status = status or remote_job.job_status(host, job_id)
    if status.get("kind") != JobKind.COMPARE:
        raise DflashError(
            f"job {job_id} on {host_name} is a {status.get('kind') or 'eval'}"
            " job, not a parity compare; run dflash parity again"
        )
    if status["state"] not in TERMINAL_STATES:
        status = remote_job.watch(
            host, job_id, (lambda ev: on_event("compare", ev)) if on_event else None
        )
    if status["state"] != JobState.DONE:
        raise remote_job.failure("job", job_id, host_name, status)
    run_dir = pull.pull_results(host, job_id, results_dir(inventory, dest))
    return finish_local(run_dir)


def annotate(
    run_dir: Path,
    host_a: str,
    host_b: str,
    opts: ParityOptions,
    sums: dict[str, str],
    stream_s: float,
) -> None:
    """Name the hosts (as the inventory calls them) and how A's capture travelled."""
    path = run_dir / "result.json"
    result = json.loads(path.read_text())
    result["hosts"] = {"a": host_a, "b": host_b}
    result["options"] = {k: v for k, v in opts.__dict__.items()}
    result["transfer"] = {
        "path": f"{host_a} -> workstation -> {host_b} (relay-send/recv)",
        "files": len(sums),
        "sha256_verified": True,
        "seconds": round(stream_s, 3),
    }
    result["created"] = time.time()
    tmp = path.with_name(".result.json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)


def finish_local(run_dir: Path) -> Path:
    """Draw the error-per-layer PNG beside the JSON (best effort, like eval's plots)."""
    try:
        parity_view.plot_layers(parity_view.load(run_dir), run_dir / "parity_layers.png")
    except Exception as exc:  # the JSON is the result
        (run_dir / "plots-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
    return run_dir
