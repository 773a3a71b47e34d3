"""A finished job's result files, checked, into a local run folder; the plots beside them."""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.errors import RemoteCommandError
from orchestrator.eval import jobwire
from orchestrator.eval.job import JobError
from orchestrator.transport.hosts import Host, HostError
from remote.protocol import RESULT_FILES, ResultError, check_files
from remote.relay.fdfiles import write_new

REQUIRED_RESULT_FILES = ("result.json",)


def pull_results(
    host: Host,
    job_id: str,
    dest: str | os.PathLike,
    end: dict | None = None,
    *,
    required: Sequence[str] = REQUIRED_RESULT_FILES,
    check: Callable[[dict[str, bytes]], None] | None = None,
) -> Path:
    """The job's result files (from `end`, else ``job pull``) into ``dest/<job-id>/``, whole,
    never through a symlink; that folder. `required`, `check`: see `decode_files`."""
    job_id = jobwire.local_job_id(job_id)
    status = end if end is not None and "files" in end else None
    if status is None:
        status = jobwire.call(host, "pull", job_id)[1]
    if not status.get("has_result"):
        error = (status.get("exit") or {}).get("error")
        raise JobError(
            f"job {job_id} on {host.name} has no result to pull (state "
            f"{status.get('state')}{': ' + error if error else ''})"
        )
    files = decode_files(host, job_id, status.get("files"), required, check)
    pulled = {
        "host": host.name,
        "job_id": job_id,
        "remote_dir": str(status.get("dir") or ""),
        "pulled": time.time(),
    }
    files["pulled.json"] = json.dumps(pulled, indent=2).encode()
    dest = Path(dest)
    final = dest / job_id
    partial = dest / f".{job_id}.partial-{os.getpid()}"
    _remove(partial)
    dest.mkdir(parents=True, exist_ok=True)
    partial.mkdir()
    try:
        folder = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for name, data in files.items():
                write_new(folder, name, data, fsync=False)
        finally:
            os.close(folder)
        _remove(final)
        os.replace(partial, final)
    finally:
        _remove(partial)
    return final


def _remove(path: Path) -> None:
    """Remove whatever is at `path`; a link itself, never its target."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def decode_files(
    host: Host,
    job_id: str,
    files: object,
    required: Sequence[str] = REQUIRED_RESULT_FILES,
    check: Callable[[dict[str, bytes]], None] | None = None,
) -> dict[str, bytes]:
    """The host's ``{name: base64}``, checked: known names only, every `required` one, their
    JSON types (then the kind's own `check`)."""
    if not isinstance(files, dict):
        raise RemoteCommandError(f"{host.name}: job {job_id}: the pull carried no files")
    out = {}
    for name in RESULT_FILES:
        if name not in files:
            continue
        try:
            out[name] = base64.b64decode(files[name], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise RemoteCommandError(
                f"{host.name}: job {job_id}: {name} arrived garbled (not base64)"
            ) from None
    for name in required:
        if name not in out:
            raise HostError(f"{host.name}: could not read {name} of job {job_id}")
    try:
        check_files(out)
        if check is not None:
            check(out)
    except ResultError as exc:
        raise RemoteCommandError(f"{host.name}: job {job_id}: {exc}; nothing was pulled") from None
    return out


def finish_local(run_dir: Path) -> Path:
    """Draw the plots beside a pulled run (best effort: plotting never loses a result)."""
    try:
        from orchestrator.results import plots
        from orchestrator.results import store as results

        run = results.load_run(run_dir)
        plots.plot_run(run, run_dir)
        plots.plot_tau_by_step(
            results.list_runs(run_dir.parent), run_dir.parent / "tau_by_step.png"
        )
    except Exception as exc:  # plots are a convenience; the JSON is the result
        (run_dir / "plots-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
    return run_dir


_warming: threading.Thread | None = None
_warming_lock = threading.Lock()


def warm_plots() -> threading.Thread:
    """Import matplotlib in the background while a job runs, once per process."""
    global _warming

    def work() -> None:
        try:
            from orchestrator.results import plots

            plots.warm()
        except Exception:  # finish_local reports plotting problems
            pass

    with _warming_lock:
        if _warming is None:
            _warming = threading.Thread(target=work, name="warm-plots", daemon=True)
            _warming.start()
        return _warming
