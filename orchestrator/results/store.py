"""Local results: one folder per run, ``<results_dir>/<run-id>/``, read and checked."""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from orchestrator.errors import DflashError
from orchestrator.ids import resolve_id
from orchestrator.inventory import Inventory
from orchestrator.relay.checkpoints import parse_step
from remote.protocol import (
    RESULT_SCHEMA,
    ResultError,
    check_ground_truth,
    check_record,
    check_result,
    check_spec,
    is_int,
)
from remote.protocol import metrics_of as metrics_of

RESULT_SCHEMA_PREFIX = RESULT_SCHEMA.split("/")[0] + "/"


@dataclass
class Run:
    """One pulled evaluation."""

    run_id: str
    path: Path
    result: dict
    spec: dict
    ground_truth: dict

    @property
    def metrics(self) -> dict:
        return metrics_of(self.result)

    @property
    def created(self) -> float:
        return float(
            self.spec.get("created")
            or (self.result.get("job") or {}).get("created")
            or self.path.stat().st_mtime
        )

    @property
    def checkpoint(self) -> str:
        inputs = self.result.get("inputs") or {}
        return str(
            self.spec.get("checkpoint")
            or inputs.get("checkpoint")
            or Path(str(_drafter_path(self.result, self.spec) or self.run_id)).name
        )

    @property
    def drafter(self) -> dict:
        """The drafter's recorded identity (docs/results.md); {} for older results."""
        ident = (self.result.get("inputs") or {}).get("drafter_identity")
        return ident if isinstance(ident, dict) else {}

    @property
    def step(self) -> int | None:
        """The training step recorded with the drafter, else the one its name carries."""
        step = self.drafter.get("step")
        if is_int(step):
            return step
        return parse_step(self.checkpoint)

    @property
    def training_run(self) -> TrainingRun:
        return training_run(self)


@dataclass(frozen=True)
class TrainingRun:
    """Which training run a checkpoint came from (docs/results.md); without a relay record
    the eval host and the drafter's folder stand in."""

    host: str
    folder: str
    name: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.host})"


GENERIC_FOLDERS = {
    "checkpoints",
    "checkpoint",
    "ckpts",
    "ckpt",
    "output",
    "outputs",
    "drafters",
    "drafter",
    "runs",
    "models",
    "saved",
    "save",
}


def results_dir(inventory: Inventory, override: str | os.PathLike | None = None) -> Path:
    """`override`, else the inventory's ``results_dir`` relative to the inventory's folder, so
    every command finds it wherever it is started."""
    if override:
        return Path(override)
    path = Path(inventory.defaults.results_dir or "results").expanduser()
    return path if path.is_absolute() else Path(inventory.path).parent / path


def run_name(folder: str) -> str:
    """A training run's name from its checkpoints folder."""
    parts = [p for p in PurePosixPath(folder).parts if p not in ("/", "")]
    for part in reversed(parts):
        if part.lower() not in GENERIC_FOLDERS:
            return part
    return parts[-1] if parts else "-"


def training_run(run: Run) -> TrainingRun:
    source = run.drafter.get("source") or {}
    if source.get("host") and source.get("path"):
        folder = str(PurePosixPath(str(source["path"])).parent)
        return TrainingRun(str(source["host"]), folder, run_name(folder))
    drafter = str(_drafter_path(run.result, run.spec) or "")
    folder = str(PurePosixPath(drafter).parent) if drafter else "-"
    host = str(run.spec.get("host") or (run.result.get("job") or {}).get("host") or "-")
    return TrainingRun(host, folder, run_name(folder))


def series_key(run: Run) -> tuple[str, str, str, str, str]:
    """What puts runs on one plot line or tracker run: training run, prompts, ground truth."""
    t = run.training_run
    prompts = (run.spec.get("prompts") or {}).get("name") or "-"
    gt = ground_truth_source(run).get("kind") or "-"
    return (t.host, t.folder, t.name, str(prompts), str(gt))


def series_label(key: tuple[str, str, str, str, str]) -> str:
    host, _folder, name, prompts, gt = key
    return f"{name} ({host}) / {prompts} / {gt}"


def _drafter_path(result: dict, spec: dict) -> Any:
    inputs = result.get("inputs") or {}
    d = inputs.get("drafter")
    if isinstance(d, dict):
        d = d.get("path")
    return d or spec.get("drafter")


def format_time(ts: float | None) -> str:
    """A Unix time as local ``YYYY-MM-DD HH:MM:SS`` (what people read); '-' for none."""
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")


class BadRun(DflashError):
    """A run folder whose files cannot be used: one line naming the run and the field."""


def load_run(path_or_id: str | Path, root: str | Path | None = None) -> Run:
    """A run from its folder, or its id or unique prefix under `root`, checked (`BadRun`)."""
    path = Path(path_or_id)
    if not (path / "result.json").is_file() and root is not None:
        path = find_folder(str(path_or_id), Path(root))
    try:
        result = json.loads((path / "result.json").read_text(errors="surrogateescape"))
    except OSError:
        raise DflashError(f"no result.json in {path}; is it a dflash run folder?") from None
    except ValueError as exc:
        raise BadRun(f"{path}/result.json is not valid JSON: {exc}") from None
    schema = str(result.get("schema", "")) if isinstance(result, dict) else ""
    if not schema.startswith(RESULT_SCHEMA_PREFIX):
        raise BadRun(f"{path}/result.json has schema {schema!r}, expected {RESULT_SCHEMA_PREFIX}*")
    spec, ground_truth = _read(path / "spec.json"), _read(path / "ground_truth.json")
    for name, check, doc in (
        ("result.json", check_result, result),
        ("spec.json", check_spec, spec),
        ("ground_truth.json", check_ground_truth, ground_truth),
    ):
        try:
            check(doc)
        except ResultError as exc:
            raise BadRun(
                f"run {path.name}: {name}: {exc}; the file is damaged or was not written by dflash"
            ) from None
    return Run(run_id=path.name, path=path, result=result, spec=spec, ground_truth=ground_truth)


def _read(path: Path) -> dict:
    """An optional JSON object of a run folder, else {}."""
    try:
        data = json.loads(path.read_text(errors="surrogateescape"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _has_result(folder: Path) -> bool:
    return (folder / "result.json").is_file()


def find_folder(ident: str, root: Path, held: Callable[[Path], bool] = _has_result) -> Path:
    """A run folder under `root` (one of those `held` accepts) by its full id, else by a
    unique prefix, else by a unique part of it."""
    if not root.is_dir():
        raise DflashError(f"no results folder {root}")
    names = [p.name for p in root.iterdir() if held(p)]
    return root / resolve_id(
        ident, names, what="run", where=f"in {root}", listed_by="dflash results list"
    )


def scan_runs(root: str | Path) -> tuple[list[Run], list[str]]:
    """Every readable eval run under `root`, oldest first, and a line per unreadable one
    (other result kinds left unsaid)."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    runs, skipped = [], []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or not (p / "result.json").is_file():
            continue
        try:
            runs.append(load_run(p))
        except BadRun as exc:
            if not _other_schema(p):
                skipped.append(str(exc))
        except DflashError:
            continue
    return sorted(runs, key=lambda r: (r.created, r.run_id)), skipped


def _other_schema(path: Path) -> bool:
    """Whether `path` holds a result of another dflash kind (``dflash.parity/1``)."""
    try:
        schema = json.loads((path / "result.json").read_text()).get("schema")
    except (OSError, ValueError, AttributeError):
        return False
    return (
        isinstance(schema, str)
        and schema.startswith("dflash.")
        and not schema.startswith(RESULT_SCHEMA_PREFIX)
    )


def list_runs(root: str | Path) -> list[Run]:
    """Every readable run under `root`, oldest first (`scan_runs` without its notes)."""
    return scan_runs(root)[0]


def records(run: Run) -> list[dict]:
    """The checked per-sample records in ground-truth order ([] when absent; `BadRun`)."""
    path = run.path / (run.result.get("samples_file") or "samples.jsonl")
    if PurePosixPath(str(run.result.get("samples_file") or "")).name != str(
        run.result.get("samples_file") or ""
    ):
        path = run.path / "samples.jsonl"  # a result never points outside its folder
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise BadRun(f"{path} line {n} is not a JSON object; the run folder is damaged")
        try:
            check_record(rec)
        except ResultError as exc:
            raise BadRun(f"{path} line {n}: {exc}; the run folder is damaged") from None
        out.append(rec)
    return out


def ground_truth_source(run: Run) -> dict:
    inputs = run.result.get("inputs") or {}
    return run.ground_truth or inputs.get("ground_truth_source") or {}
