"""``dflash parity``: do two hosts compute the same target features, and what does the
difference cost in tau?

    run_parity(inventory, "trainer", "evalhost", ParityOptions(drafter="step_800"))

0. Both hosts are checked before either captures, at once: each host's python and
   packages, its target (resolved as an eval's; on B with its tokenizer where prompts are
   text) and the memory a capture takes, by the host's own ``preflight``; then the two
   targets' identities (`remote.probe.identity`) are compared, and targets that are not
   copies of one checkpoint are refused in one line (``allow_different_targets`` compares
   them anyway). Both sides compute in one dtype unless asked otherwise (`same_dtype`).
1. Host B (the comparing host, usually the eval host) runs a ``parity-capture`` job: the
   eval's ground truth (its cache, or made once), then one forward of its target over
   prompt + completion ids, keeping the chosen layers' raw outputs and the logits' top-k.
2. That ground-truth file goes to host A (through this machine), whose own capture job runs
   over the very same ids.
3. A's capture files stream to B through this machine on the relay's verified data path
   (``relay-send`` on A, ``relay-recv`` on B, sha256 on both ends compared here): the
   hosts never need to reach each other.
4. B runs a ``parity-compare`` job (`remote.eval.parity`) and the result is pulled into
   ``<results_dir>/<job-id>/`` like an eval's, with a PNG of error per layer.

Every job is a detached `remote.jobs` job: ``dflash jobs`` lists them, ``--cancel`` stops
them, a dropped connection leaves them running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval import job as remote_job
from orchestrator.eval import jobwire, pull
from orchestrator.eval.shard import GROUND_TRUTH_MAX
from orchestrator.eval.spec import (
    EvalOptions,
    build_spec,
    engine_spec,
    new_job_id,
    resolve_checkpoint,
    target_model,
)
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.relay.run import RELAY_PYTHON_FLAGS
from orchestrator.relay.stream import Stream, describe_failure, file_lines, pump, send_request
from orchestrator.results import parity_view
from orchestrator.results.store import results_dir
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import JOB_ENGINE_DEFAULT, JOB_EVAL_KEY, EvalSpec
from remote.relay.fdfiles import write_all

INBOX = ".partial-parity-a"  # relay-recv writes only under a partial folder
CAPTURE_MAX = 64 << 20  # a capture's result.json: its settings, file list and sample list
FROM_B = "(host B's ground truth, copied after its capture)"  # A's, when it is checked
ATTN = ("sdpa", "eager")

EventHandler = Callable[[str, dict], None]  # (stage, event)


@dataclass
class ParityOptions:
    """What to compare. ``model_a``/``model_b``: target folders on each host (default: the
    host's ``roles.eval.target_model``); ``layers``: None = the drafter's target layers
    (all layers without a drafter); ``dtype``: both sides' dtype, ``dtype_a``/``dtype_b``
    one side's (see `same_dtype` for the default); ``attn_*``: the attention
    implementation (sdpa, eager; None = transformers' default);
    ``allow_different_targets``: compare targets that are not copies of one checkpoint."""

    model_a: str | None = None
    model_b: str | None = None
    prompts: str | None = None
    samples: int | None = None
    seed: int = 0
    max_new_tokens: int | None = None
    ground_truth: str | None = None
    ground_truth_kind: str | None = None
    # the bounds on waiting for B's ground truth, and whether to make it again (EvalOptions)
    ground_truth_timeout: float | None = None
    ground_truth_deadline: float | None = None
    ground_truth_phase_deadline: float | None = None
    fresh_ground_truth: bool = False
    drafter: str | None = None
    layers: list[int] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    device_a: str = "cpu"
    device_b: str = "cpu"
    attn_a: str | None = None
    attn_b: str | None = None
    topk: int = 8
    threads: int | None = None
    dtype: str | None = None
    allow_different_targets: bool = False

    def __post_init__(self) -> None:
        # each side's engine settings are one EvalSpec, checked (and normalised) here
        a, b = self.engine("a")[0], self.engine("b")[0]
        self.device_a, self.device_b = a.device, b.device
        self.dtype_a = a.dtype if self.dtype_a is not None else None
        self.dtype_b = b.dtype if self.dtype_b is not None else None
        self.dtype = engine_spec(dtype=self.dtype)[0].dtype if self.dtype is not None else None
        for name in ("attn_a", "attn_b"):
            v = getattr(self, name)
            if v is not None and v not in ATTN:
                raise DflashError(f"--{name.replace('_', '-')} must be sdpa or eager, got {v!r}")
        if self.layers is not None and (
            not self.layers or any(not isinstance(i, int) or i < 0 for i in self.layers)
        ):
            raise DflashError(f"--layers must be layer numbers from 0, got {self.layers!r}")
        if self.topk < 1:
            raise DflashError(f"--topk must be at least 1, got {self.topk}")
        # EvalOptions checks samples, prompts, ground truth the one way eval does
        self.eval_options()

    def engine(self, side: str) -> tuple[EvalSpec, frozenset[str]]:
        """Side `side`'s engine settings (dtype, device, threads) and which were given."""
        a = side == "a"
        return engine_spec(
            dtype=(self.dtype_a if a else self.dtype_b) or self.dtype,
            device=self.device_a if a else self.device_b,
            threads=self.threads,
        )

    def eval_options(self, side: str = "b") -> EvalOptions:
        engine, chosen = self.engine(side)
        return EvalOptions(
            prompts=self.prompts,
            samples=self.samples,
            seed=self.seed,
            max_new_tokens=self.max_new_tokens,
            ground_truth=self.ground_truth,
            ground_truth_kind=self.ground_truth_kind,
            ground_truth_timeout=self.ground_truth_timeout,
            ground_truth_deadline=self.ground_truth_deadline,
            ground_truth_phase_deadline=self.ground_truth_phase_deadline,
            fresh_ground_truth=self.fresh_ground_truth,
            target=self.model_a if side == "a" else self.model_b,
            engine=engine,
            chosen=chosen,
        )


def same_dtype(opts: ParityOptions, spec_b: HostSpec) -> ParityOptions:
    """`opts` with both sides' dtype chosen: a side's own (``dtype_a``/``dtype_b``), else
    ``dtype``, else B's inventory dtype (what its evals compute in), else the job default.
    So both hosts compute in one dtype unless the caller asks for two; each host's own
    inventory dtype never silently makes them differ."""
    role = spec_b.eval
    base = opts.dtype or (role.dtype if role is not None else JOB_ENGINE_DEFAULT.dtype)
    return replace(opts, dtype_a=opts.dtype_a or base, dtype_b=opts.dtype_b or base)


def target_difference(a: dict | None, b: dict | None) -> str | None:
    """How the targets of two preflight identities (`remote.probe.identity`) differ, in a
    phrase; None when they are copies of one checkpoint (text config, text weights' names
    and shapes) or a side said nothing to compare."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None

    def part(x: dict, key: str) -> dict:  # a host's answer: any JSON at all
        v = x.get(key)
        return v if isinstance(v, dict) else {}

    def word(v: object) -> str:  # one line, whatever a host put in it
        return " ".join(str(v).split())

    def shape(x: dict) -> str:
        t = part(x, "text")
        return word(
            f"{x.get('architecture')} ({t.get('num_layers')} layers, hidden "
            f"{t.get('hidden_size')}, vocab {t.get('vocab_size')})"
        )

    ca, cb = part(a, "config"), part(b, "config")
    keys = sorted(word(k) for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    wa, wb = part(a, "weights"), part(b, "weights")
    if not keys and wa.get("sha256") == wb.get("sha256"):
        return None
    what = [f"A has {shape(a)}, B {shape(b)}"]
    if keys:
        what.append(
            f"their text configs differ in {', '.join(keys[:5])}"
            + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        )
    if wa.get("sha256") != wb.get("sha256"):
        what.append(
            f"their text weights differ in names or shapes ({word(wa.get('tensors'))} "
            f"tensors on A, {word(wb.get('tensors'))} on B)"
        )
    return "; ".join(what)


def check_hosts(a: Host, job_a: dict, b: Host, job_b: dict, opts: ParityOptions) -> dict:
    """Both hosts' preflight of their capture jobs, run at once (`job_a`: A's, its ground
    truth deferred: B's selection arrives after B's capture), then the targets' identities
    compared; the first problem raises one line naming its host. Returns the reports by
    side."""
    with ThreadPoolExecutor(2, thread_name_prefix="parity-preflight") as pool:
        futures = {
            "a": pool.submit(remote_job.preflight, a, job_a),
            "b": pool.submit(remote_job.preflight, b, job_b),
        }
        reports = {side: f.result() for side, f in futures.items()}  # A's problem first
    for host, report in ((a, reports["a"]), (b, reports["b"])):
        if not isinstance(report, dict):
            raise RemoteCommandError(
                f"{host.name}: preflight answered {type(report).__name__}, not a JSON object"
            )
    diff = target_difference(
        reports["a"].get("target_identity"), reports["b"].get("target_identity")
    )
    if diff and not opts.allow_different_targets:
        raise DflashError(
            f"the targets on {a.name} and {b.name} are not the same checkpoint: {diff}; "
            "parity compares one model's numerics on two hosts: point --model-a/--model-b "
            "at copies of one checkpoint, or pass --allow-different-targets to compare anyway"
        )
    return reports


def parse_layers(text: str | None) -> list[int] | None:
    """``"0,2,5"`` or ``"0-5"`` (or a mix) as a list; None stays None."""
    if not text:
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                out += list(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise DflashError(f"--layers expects numbers like 0,2,5 or 0-5, got {text!r}") from None
    return out


def _capture_engine(
    host: Host, spec: HostSpec, opts: ParityOptions, side: str, drafter: str | None
) -> EvalSpec:
    """Side `side`'s EvalSpec: its target, the drafter (on B; none on A), its dtype,
    device and threads over the host's inventory role, as an eval resolves them."""
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
    """A ``parity-capture`` job spec; ground truth, prompts and sampling resolved as an eval
    does (`ground_truth_file`: the other host's selection, used whole)."""
    eo = opts.eval_options(side)
    job = build_spec(host, spec, f"parity-{side}", eo, engine=engine, exact_file=ground_truth_file)
    job.update(
        kind="parity-capture",
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
    if end["state"] != "done":
        err = (end.get("exit") or {}).get("error")
        raise remote_job.JobError(
            f"{stage} job {ref.job_id} on {host.name} {end['state']}{': ' + err if err else ''}"
        )
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


def copy_ground_truth(b: Host, b_dir: str, a: Host) -> str:
    """B's ground-truth selection, put on A (content-addressed); returns A's path."""
    import hashlib

    raw = jobwire.fetch(b, f"{b_dir}/ground_truth.json", "ground_truth.json", jobwire.ANSWER_MAX)
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("file"), str):
        raise DflashError(f"{b.name}: its capture job names no ground truth file")
    data = jobwire.fetch(b, info["file"], "the ground truth", GROUND_TRUTH_MAX)
    path = f"{a.workdir}/parity/{hashlib.sha256(data).hexdigest()[:16]}-ground_truth.jsonl"
    if not a.exists(path):
        a.put_bytes(data, path)
    return path


def capture_files(capture: dict, host: str) -> list[str]:
    """The files a capture's result.json names, checked: relative, inside its folder."""
    files = capture.get("files")
    if not isinstance(files, list) or not files:
        raise DflashError(f"{host}: the capture lists no files")
    for f in files:
        if (
            not isinstance(f, str)
            or f.startswith("/")
            or ".." in f.split("/")
            or not f.startswith("capture/")
        ):
            raise DflashError(f"{host}: the capture names a file outside its folder: {f!r}")
    return ["result.json", *files]


def stream_folder(
    inventory: Inventory,
    src: Host,
    src_dir: str,
    files: list[str],
    dest: Host,
    dest_root: str,
    dest_rel: str,
) -> dict[str, str]:
    """Stream ``src_dir/<file>`` for each of `files` to ``dest_root/dest_rel/<file>`` on the
    relay's data path (one ``relay-send`` on `src`, one ``relay-recv`` on `dest`, bytes
    pumped through this machine, never touching its disk). Each file's sha256 is computed
    on both hosts and compared here; returns file -> sha256, or raises one line."""

    def start(host: Host, argv: list[str]) -> Stream:
        line = bundle.remote_command(host, argv, python_flags=RELAY_PYTHON_FLAGS)
        return Stream(host, line, inventory, stdin=True, stdout=True)

    s = start(src, ["relay-send"])
    d = start(dest, ["relay-recv", "--", dest_root])
    try:
        try:
            write_all(
                s.stdin_fd,
                json.dumps([{"path": f"{src_dir}/{f}", "offset": 0} for f in files]).encode(),
            )
        except OSError:
            pass  # the source is gone: its exit status says why
        s.close_stdin()
        send_request(d, [{"path": f"{dest_rel}/{f}", "offset": 0} for f in files])
        pump(s, [d], [[0] for _ in files])
    except BaseException:
        s.kill()
        d.kill()
        raise
    scode, _, serr = s.finish()
    dcode, out, derr = d.finish()
    if scode != 0:
        raise DflashError(describe_failure(src, scode, serr))
    if dcode != 0:
        raise DflashError(describe_failure(dest, dcode, derr))
    sent, got = file_lines(serr), file_lines(out.decode(errors="replace"))
    sums = {}
    for i, f in enumerate(files):
        a, b = sent.get(i), got.get(i)
        if not a or not b or a.get("sha256") != b.get("sha256") or a.get("size") != b.get("size"):
            raise DflashError(
                f"{f}: sha256 or size differs between {src.name} and {dest.name}"
                " after streaming; run parity again"
            )
        sums[f] = b["sha256"]
    return sums


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
    """Capture on B, then on A over B's ids, stream A's capture to B, compare on B, pull.
    Returns the local run folder (``result.json`` schema ``dflash.parity/1``)."""
    opts = options or ParityOptions()
    if host_a == host_b:
        raise DflashError("parity compares two hosts; name two different ones")
    spec_a, spec_b = inventory.host(host_a), inventory.host(host_b)
    opts = same_dtype(opts, spec_b)
    with open_host(spec_a, inventory) as a, open_host(spec_b, inventory) as b:
        # Both targets resolved (one line for a host with none) before either host is asked.
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
        pre_a["ground_truth"]["deferred"] = True  # B's selection, copied after its capture
        check_hosts(a, pre_a, b, job_b, opts)
        st_b = _run_job(b, job_b, f"capture {host_b}", on_event, on_start)
        cap_b = _result(b, st_b["dir"])
        # A captures the layers B chose (the drafter lives on B), over B's very ids
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
            "kind": "parity-compare",
            "created": time.time(),
            "host": host_b,
            "checkpoint": "parity",
            "workdir": b.workdir,
            "capture_a": f"{st_b['dir']}/{INBOX}",
            "capture_b": st_b["dir"],
            # B's engine settings: the drafter walks on B's target, in B's dtype and device
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
) -> Path:
    """Watch a parity compare job (after a dropped connection) to its end and pull its
    result; a capture job cannot be resumed on its own (its partner host's part would be
    missing): run parity again, B's ground truth comes from its cache."""
    with open_host(inventory.host(host_name), inventory) as host:
        status = remote_job.job_status(host, job_id)
        if status.get("kind") != "parity-compare":
            raise DflashError(
                f"job {job_id} on {host_name} is a {status.get('kind') or 'eval'}"
                " job, not a parity compare; run dflash parity again"
            )
        if status["state"] not in ("done", "failed", "cancelled", "lost"):
            status = remote_job.watch(
                host, job_id, (lambda ev: on_event("compare", ev)) if on_event else None
            )
        if status["state"] != "done":
            err = (status.get("exit") or {}).get("error")
            raise remote_job.JobError(
                f"job {job_id} on {host_name} {status['state']}{': ' + err if err else ''}"
            )
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
