"""Results as CSV, JSON lines, TensorBoard and W&B, named by the registry (docs/results.md)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from orchestrator.errors import DflashError
from orchestrator.printable import printable
from orchestrator.results import breakdown, speedup, summary
from orchestrator.results import store as res
from remote.atomic import write_atomic

FORMATS = ("csv", "jsonl", "tensorboard", "wandb")
TEXT_FORMATS = ("csv", "jsonl")  # the formats that can go to stdout
STEP_METRIC = "train/step"

# A cell a spreadsheet would run as a formula is quoted as text (docs/results.md).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class TrackerUnavailable(DflashError):
    """The tracker's library is not installed."""


def row(run: res.Run) -> dict[str, Any]:
    """One run as a flat dict: summary, metrics per budget, speedup costs, its groups."""
    out = {k: v for k, v in summary.summary(run).items() if k != "ddtree"}
    out.update(summary.flat(run))
    for b, v in speedup.estimate(run).get("ddtree", {}).items():
        out[f"speedup_estimate_ddtree_{b}"] = v
    out.update(speedup.cost_columns(run))
    out.update(breakdown.flat(run))
    return out


def scalars(run: res.Run) -> dict[str, float]:
    """The tracker scalars of a run, None values left out."""
    out = {**summary.tracked(run), **breakdown.tracked(run)}
    return {k: float(v) for k, v in out.items() if v is not None}


def series_name(key: tuple) -> str:
    """A file-name-safe, stable name for a series: readable part + short hash of the key."""
    host, _folder, name, prompts, gt = key
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}-{host}-{prompts}-{gt}").strip("-.")
    digest = hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:8]
    return f"{readable[:80]}-{digest}"


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell no spreadsheet runs, its text `printable`."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return value
    text = printable(value)
    if value.startswith(FORMULA_START) and not NUMBER.fullmatch(value):
        return "'" + text
    return text


def render_csv(runs: list[res.Run]) -> str:
    """The CSV of `runs`: a header, then one `row` per run."""
    rows = [row(r) for r in runs]
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: csv_cell(v) for k, v in r.items()})
    return buf.getvalue()


def render_jsonl(runs: list[res.Run]) -> str:
    """One JSON `row` per line (ASCII: a lone surrogate is a ``\\udcxx`` escape)."""
    return "".join(json.dumps(row(r), default=str) + "\n" for r in runs)


def render_text(runs: list[res.Run], fmt: str) -> str:
    """The csv or jsonl export of `runs`, as text (for stdout)."""
    if fmt == "csv":
        return render_csv(runs)
    if fmt == "jsonl":
        return render_jsonl(runs)
    raise DflashError(f"{fmt} is not a text format; use one of {', '.join(TEXT_FORMATS)}")


def write_csv(runs: list[res.Run], path: str | Path) -> Path:
    return _atomic(Path(path), render_csv(runs))


def write_jsonl(runs: list[res.Run], path: str | Path) -> Path:
    return _atomic(Path(path), render_jsonl(runs))


def _atomic(path: Path, text: str) -> Path:
    """`text` written to `path` atomically (a reader never sees half an export)."""
    if path.is_dir():
        raise DflashError(f"{path} is a folder; give a file name for the export")
    return write_atomic(path, text)


class Tracker(Protocol):
    def log(self, run: res.Run) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Scalars per run into ``<logdir>/<series name>/`` event files."""

    def __init__(self, logdir: str | Path):
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise TrackerUnavailable(
                "TensorBoard export needs tensorboard: pip install tensorboard"
            ) from None
        self._event, self._summary, self._writer_cls = Event, Summary, EventFileWriter
        self.logdir = Path(logdir)
        if self.logdir.exists() and not self.logdir.is_dir():
            raise DflashError(f"{self.logdir} is a file; TensorBoard needs a log folder")
        self.writers: dict[str, Any] = {}

    def log(self, run: res.Run) -> None:
        if run.step is None:
            return
        name = series_name(res.series_key(run))
        if name not in self.writers:
            self.writers[name] = self._writer_cls(str(self.logdir / name))
        values = [
            self._summary.Value(tag=tag, simple_value=value) for tag, value in scalars(run).items()
        ]
        w = self.writers[name]
        w.add_event(
            self._event(wall_time=run.created, step=run.step, summary=self._summary(value=values))
        )
        w.flush()

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers.clear()


class WandbTracker:
    """One wandb run per series in `project`, offline unless ``$WANDB_MODE``; ids derive from
    the series, so a later export resumes it (or, offline, ``wandb sync`` merges)."""

    def __init__(self, project: str, directory: str | Path, mode: str | None = None):
        try:
            import wandb
        except ImportError:
            raise TrackerUnavailable("W&B export needs wandb: pip install wandb") from None
        self.wandb = wandb
        self.project = project
        self.dir = Path(directory)
        self.mode = mode or os.environ.get("WANDB_MODE") or "offline"
        if self.mode not in ("offline", "online", "disabled"):
            raise DflashError(f"WANDB_MODE {self.mode!r} is not offline, online or disabled")
        self.runs: dict[str, Any] = {}

    def _run(self, run: res.Run) -> Any:
        key = res.series_key(run)
        name = series_name(key)
        if name not in self.runs:
            self.dir.mkdir(parents=True, exist_ok=True)
            t = run.training_run
            self.runs[name] = self.wandb.init(
                project=self.project,
                name=res.series_label(key),
                id=name[-8:] + "-" + hashlib.sha256(self.project.encode()).hexdigest()[:6],
                dir=str(self.dir),
                mode=self.mode,
                resume="allow",
                reinit="create_new",
                config={
                    "trainer": t.host,
                    "checkpoints_folder": t.folder,
                    "training_run": t.name,
                    "prompts": key[3],
                    "ground_truth": key[4],
                },
                settings=self.wandb.Settings(silent=True, console="off"),
            )
            self.runs[name].define_metric(STEP_METRIC)
            self.runs[name].define_metric("*", step_metric=STEP_METRIC)
        return self.runs[name]

    def log(self, run: res.Run) -> None:
        if run.step is None:
            return
        s = scalars(run)
        self._run(run).log({STEP_METRIC: run.step, **s})

    def close(self) -> None:
        for r in self.runs.values():
            r.finish()
        self.runs.clear()


def export(runs: Iterable[res.Run], fmt: str, out: str | Path) -> Path:
    """Write `runs` to `out` in `fmt` (a file, a log folder, or wandb's ``[DIR/]PROJECT``);
    the file or folder written."""
    runs = [r for r in runs]
    if fmt == "csv":
        return write_csv(runs, out)
    if fmt == "jsonl":
        return write_jsonl(runs, out)
    if fmt == "tensorboard":
        tracker: Tracker = TensorBoardTracker(out)
        where = Path(out)
    elif fmt == "wandb":
        path = Path(out)
        where = path.parent if str(path.parent) != "." else Path(".")
        tracker = WandbTracker(path.name, where)
    else:
        raise DflashError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    try:
        for r in sorted(runs, key=lambda r: (r.step is None, r.step or 0, r.created)):
            tracker.log(r)
    finally:
        tracker.close()
    return where
