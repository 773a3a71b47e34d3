"""``preflight``: can this host run this eval job? Answered before anything is loaded.

Checks, in order, each failure one line (a `UserError`): the python version; torch,
transformers and safetensors installed (from package metadata, nothing imported); the
counts (threads, samples); the target folder, and its tokenizer files where prompts are
text to tokenise (every ground-truth kind but ``file``); the drafter folder (a parity
capture may have none); the prompts or ground-truth file; free RAM against the bytes the
target's text part and the drafter will take in the job's dtype (the target's text part as
the eval engine finds it, `remote.model`, on the meta device; the drafter's weights as its
loader reads them; never a tensor of the target); and the ground-truth server reachable
FROM this host. Success prints one JSON document with what was found; for a parity capture
it carries the target's identity (`remote.probe.identity`), so the controller can tell two
hosts' targets apart before either captures.

``--target-only`` stops after the target's checks (python, packages, the target folder and
its tokenizer): what ``dflash follow`` asks once before its first checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from remote.errors import UserError
from remote.model.files import require_tokenizer
from remote.probe.facts import meminfo, package_version
from remote.protocol import (
    ENGINE_PACKAGES,
    EvalSpec,
    GroundTruthSpec,
    JobKind,
    JobSpec,
    SpecError,
)

MIN_PYTHON = (3, 10)
REQUIRED = {name: (name,) for name in ENGINE_PACKAGES}
# Activations, the one-sequence forward, tokenizer and python itself.
OVERHEAD_FRACTION = 0.10
OVERHEAD_BYTES = 512 * 1024 * 1024


def describe_target(folder: Path, dtype: str):
    """The target as the engine will see it, and the bytes its text part takes in `dtype`
    (backbone + head found in the module tree; the vision tower never counted)."""
    import torch

    from remote.model.layout import describe, text_weight_bytes

    d = describe(folder, getattr(torch, dtype))
    return d, text_weight_bytes(d.model, d.layout, getattr(torch, dtype))


def drafter_bytes(folder: Path, dtype: str) -> int:
    """Bytes the drafter's weights take in `dtype`, found as its loader finds them."""
    from remote.eval.drafter import weight_shapes
    from remote.model.files import ST_DTYPES, dtype_bytes

    per = dtype_bytes(dtype)
    total = 0
    for _file, kind, shape in weight_shapes(str(folder))[0].values():
        n = 1
        for dim in shape:
            n *= int(dim)
        floating = kind.startswith(("F", "BF", "float", "bfloat"))
        total += n * (per if floating else ST_DTYPES.get(kind, ("", 8))[1])
    return total


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _model_folder(path: str | None, what: str, missing: str = "") -> Path:
    """The model folder at `path`, if it has a config and weights; else one line (with
    `missing` after it where the folder is not there at all)."""
    if not path:
        raise UserError(f"no {what} given; set it in the inventory's eval role or pass it")
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"{what} folder {path} does not exist on this host{missing}")
    if not (folder / "config.json").is_file():
        raise UserError(f"{what} folder {path} has no config.json")
    if not any(f.suffix in (".safetensors", ".bin", ".pt", ".pth") for f in folder.iterdir()):
        raise UserError(f"{what} folder {path} holds no weight files (*.safetensors, *.bin, *.pt)")
    return folder


def _relay_first(job: JobSpec) -> str:
    """What to do about a drafter not on this host yet, as the controller says it: relay the
    checkpoint the job names (the controller records its name and this host's) here."""
    name, host = job.doc.get("checkpoint"), job.doc.get("host")
    if not (isinstance(name, str) and isinstance(host, str) and name and host):
        return ""
    return f"; relay it here first: dflash relay {shlex.quote(name)} --to {shlex.quote(host)}"


def read_job(spec: dict | JobSpec, engine: EvalSpec | None = None) -> JobSpec:
    """The job `spec` typed (`remote.protocol.JobSpec`: every setting and block checked,
    so a value the job would only trip over after the ground-truth phase is refused now;
    one line each, ``job spec: ...``); `engine`: its EvalSpec when the caller has read it
    already. Every job kind reads its spec through this one function."""
    if not isinstance(spec, JobSpec):
        try:
            spec = JobSpec.from_json(spec)
        except SpecError as exc:
            raise UserError(f"job spec: {exc}") from None
    return spec if engine is None else replace(spec, engine=engine)


def check_target(
    spec: dict | JobSpec, engine: EvalSpec | None = None
) -> tuple[dict, JobSpec, Path]:
    """The checks of the host and the target alone (python, packages, the job's settings,
    the target folder, its tokenizer when the ground truth is made from text prompts); the
    report so far, the job (`read_job`) and the target folder."""
    report: dict = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "python_executable": sys.executable,
    }
    if sys.version_info[:2] < MIN_PYTHON:
        raise UserError(
            f"python {report['python']} at {sys.executable} is too old; dflash "
            f"needs {'.'.join(map(str, MIN_PYTHON))}+ (set 'python:' for the host)"
        )
    versions = {name: package_version(name, dists) for name, dists in REQUIRED.items()}
    missing = [n for n, v in versions.items() if v is None]
    if missing:
        raise UserError(
            f"{', '.join(missing)} not installed for {sys.executable}; install "
            f"them there (pip install {' '.join(missing)}) or point 'python:' at "
            "the right environment"
        )
    report["packages"] = versions
    job = read_job(spec, engine)
    engine = job.engine
    if engine.device != "cpu":  # a GPU asked of a host without one: now
        from remote.eval.device import resolve

        report["device"] = str(resolve(engine.device))
    target = _model_folder(engine.target, "target model")
    if job.ground_truth.source.reads_prompts and not _token_id_prompts(job):
        require_tokenizer(target)  # text: the target's tokenizer makes ids
    return report, job, target


def _token_id_prompts(job: JobSpec) -> bool:
    """Whether the job's prompts file is there and gives every prompt as token ids (no
    tokenizer needed); an unreadable one is the prompts check's to report."""
    from remote.protocol import parse_prompts, prompt_lines, token_ids_only

    if not job.prompts or not Path(job.prompts).is_file():
        return False
    try:
        with open(job.prompts, "rb") as fh:
            return token_ids_only(parse_prompts(prompt_lines(fh, job.prompts), job.prompts, "p"))
    except (OSError, SpecError):
        return False


def check(spec: dict | JobSpec, engine: EvalSpec | None = None, keep: dict | None = None) -> dict:
    """Run every check on job `spec` (its document, or the `JobSpec` read from it); raise
    the first failure, else return what was found. `engine`: the job's EvalSpec (its
    ``eval``) when the caller has read it already.
    `keep`: given, receives ``plan`` (`remote.model.load.plan_text`'s answer for the target
    in the job's dtype) so the job loads the target without describing it again."""
    began = time.perf_counter()
    report, job, target = check_target(spec, engine)
    engine, gt = job.engine, job.ground_truth
    dtype = engine.dtype
    parity = job.kind in (JobKind.CAPTURE, JobKind.COMPARE)
    # A parity capture reads the drafter's config for its layers, when it has one.
    drafter = (
        _model_folder(engine.drafter, "drafter checkpoint", _relay_first(job))
        if engine.drafter or not parity
        else None
    )
    kind = gt.kind
    if gt.source.reads_prompts:
        if not job.prompts or not Path(job.prompts).is_file():
            raise UserError(f"prompts file {job.prompts} does not exist on this host")
    elif gt.awaits_file():  # arrives in the job's folder after the start
        pass
    elif not gt.path or not Path(gt.path).is_file():
        raise UserError(f"ground truth file {gt.path} does not exist on this host")
    if job.stop_after == "ground_truth" and not gt.source.on_target:
        # Nothing is loaded by a job that only fetches ground truth (a sharded eval's first
        # job): no torch import and no memory check here; each shard's job checks its own.
        report["ground_truth"] = {"kind": kind, "url": gt.url, "path": gt.path}
        return _reachable(gt, report)
    # Where a job's start-up goes (`seconds`): torch + transformers, then the target's
    # modeling code and its meta-device model, then the checks that follow.
    marks = {"before_s": time.perf_counter() - began}
    t = time.perf_counter()
    import torch  # noqa: F401  (the one import every later step needs; timed on its own)
    import transformers  # noqa: F401

    marks["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    described, need_target = describe_target(target, dtype)
    marks["describe_s"] = time.perf_counter() - t
    t = time.perf_counter()
    need_drafter = drafter_bytes(drafter, dtype) if drafter is not None else 0
    need = int((need_target + need_drafter) * (1 + OVERHEAD_FRACTION) + OVERHEAD_BYTES)
    if drafter is not None and not parity:  # the drafter's window, the longest context
        need += _contexts(job, drafter, report)
    widening = _widening(engine, described.layout, None if parity else drafter)
    need += widening
    mem = meminfo()
    report["memory"] = {
        "target_bytes": need_target,
        "drafter_bytes": need_drafter,
        "context_bytes": (report.get("drafter_window") or {}).get("context_bytes", 0),
        "widening_bytes": widening,
        "needed_bytes": need,
        "available_bytes": mem["available"],
        "total_bytes": mem["total"],
    }
    if mem["available"] and need > mem["available"]:
        raise UserError(
            f"not enough free RAM: the target's text weights ({_gib(need_target)})"
            f" and the drafter ({_gib(need_drafter)}) in {dtype} need about "
            f"{_gib(need)}, and {_gib(mem['available'])} is available"
        )
    # What the engine checks before reading a tensor: whole shards, every text weight there.
    from remote.model.load import plan_text

    plan = plan_text(target, None, described)
    if keep is not None:
        keep["plan"] = plan
    if parity:
        from remote.probe.identity import target_identity

        report["target_identity"] = target_identity(*plan)
    report["ground_truth"] = {"kind": kind, "url": gt.url, "path": gt.path}
    report = _reachable(gt, report)
    marks["after_s"] = time.perf_counter() - t
    report["seconds"] = {k: round(v, 3) for k, v in marks.items()}
    return report


def _widening(engine: EvalSpec, layout, drafter: Path | None) -> int:
    """The buffer bf16 products take where this host computes them in float32 (as the
    engine counts it: `remote.eval.memory.widening_bytes`)."""
    import torch

    from remote.eval.device import bf16_products
    from remote.eval.drafter_config import read_config
    from remote.eval.memory import widening_bytes

    if bf16_products(torch.device(engine.device), engine.dtype) != "float32":
        return 0
    dcfg = None if drafter is None else read_config(str(drafter))
    return widening_bytes(layout.hidden_size, layout.vocab_size, dcfg)


def _contexts(job: JobSpec, drafter: Path, report: dict) -> int:
    """The drafter's window against the longest context the job will reach
    (`remote.eval.context_check`), in the report (``drafter_window``; its warning line
    in ``warnings``), and the bytes that context's working set takes (0 when it is not
    known yet: a deferred ground truth)."""
    from remote.eval.context_check import window_report
    from remote.eval.drafter_config import read_config
    from remote.eval.memory import context_bytes
    from remote.model.files import dtype_bytes

    got = window_report(job, drafter)
    if got["warning"]:
        report.setdefault("warnings", []).append(got["warning"])
    longest, dtype = got["longest_context"], job.engine.dtype
    if longest:
        cfg = read_config(str(drafter))
        got["context_bytes"] = context_bytes(
            cfg, longest, dtype_bytes(dtype), job.engine.block_chunk
        )
    report["drafter_window"] = got
    return got.get("context_bytes", 0)


def _reachable(gt: GroundTruthSpec, report: dict) -> dict:
    """The last check: a ground-truth server reachable from this host; the report, ok."""
    from remote.httpclient import reachable

    problem = gt.missing_source()
    if problem is None and gt.source.server:
        problem = reachable(gt.url, 5.0)
    if problem:
        raise UserError(problem)
    report["ok"] = True
    return report


def _cmd(args: argparse.Namespace) -> int:
    data = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
    try:
        spec = json.loads(data)
    except ValueError as exc:
        raise UserError(f"preflight spec is not JSON: {exc}") from None
    if args.target_only:
        report = dict(check_target(spec)[0], ok=True)
    else:
        report = check(spec)
    print(json.dumps(report), flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser("preflight", help="check a host can run an eval job, loading nothing")
    p.add_argument("--spec", default="-", help="job spec JSON file, or - for stdin")
    p.add_argument(
        "--target-only",
        action="store_true",
        help="check python, packages, the target folder and its tokenizer only",
    )
    p.set_defaults(func=_cmd)
