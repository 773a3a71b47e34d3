"""One job on one host, from the workstation: check, start, watch, status, list, cancel."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.errors import DflashError
from orchestrator.eval import jobwire
from orchestrator.eval.spec import new_job_id
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, HostError, Result
from orchestrator.transport.lines import HostLines
from remote.protocol import JOB_CARRY_KEY, WATCH_END_EVENT

EventHandler = Callable[[dict], None]


class JobError(DflashError):
    """A job failed, was cancelled or was lost; the message says which and why."""


@dataclass
class JobRef:
    """A started job: where it runs and how to find it again."""

    host: str
    job_id: str
    dir: str
    pid: int
    pgid: int
    bundle_pushed: bool
    spec: dict
    # follow=True: the starting command streams on; `watch` reads it, opening no other
    stream: HostLines | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "job_id": self.job_id,
            "dir": self.dir,
            "pid": self.pid,
            "pgid": self.pgid,
            "bundle_pushed": self.bundle_pushed,
        }


def preflight(host: Host, spec: dict, *, target_only: bool = False) -> dict:
    """The host-side checks for `spec`, nothing loaded; the first failure raises one line."""
    argv = ["preflight", "--spec", "-", *(["--target-only"] if target_only else [])]
    return bundle.run_remote_json(host, argv, payload=spec, timeout=120)


def start_job(
    host: Host,
    spec: dict,
    job_id: str | None = None,
    preflight: bool = False,
    *,
    follow: bool = False,
) -> JobRef:
    """Start the job detached, after the host's checks with `preflight`, streaming with `follow`."""
    job_id = jobwire.local_job_id(job_id or new_job_id(spec.get("checkpoint") or "job"))
    argv = [
        *jobwire.job_argv(host, "start", job_id),
        "--spec=-",
        *(["--preflight"] if preflight else []),
        *(["--follow", "--pull"] if follow else []),
    ]
    stream, info = jobwire.call(host, "start", job_id, argv=argv, payload=spec, keep=follow)
    return JobRef(
        host=host.name,
        job_id=job_id,
        dir=info["dir"],
        pid=info["pid"],
        pgid=info["pgid"],
        bundle_pushed=bundle.was_pushed(host),
        spec={k: v for k, v in spec.items() if k != JOB_CARRY_KEY},
        stream=stream,
    )


def job_status(host: Host, job_id: str) -> dict:
    """The job's state (`remote.protocol.JOB_STATES`) and last progress event, checked."""
    return jobwire.call(host, "status", jobwire.local_job_id(job_id))[1]


def list_jobs(host: Host) -> list[dict]:
    """Every job on the host, oldest first, with its state (each row checked)."""
    return jobwire.call(host, "list")[1]


def cancel(host: Host, job_id: str) -> dict:
    """Stop the job and all its processes (its process group), waiting until none is left."""
    return jobwire.call(host, "cancel", jobwire.local_job_id(job_id))[1]


def prune(host: Host, older_than: float, caches: Sequence[str] = (), dry_run: bool = False) -> dict:
    """Remove the host's finished job folders (and `caches`) older than `older_than` s."""
    argv = [
        *jobwire.job_argv(host, "prune"),
        f"--older-than={older_than!r}",
        *(f"--cache={c}" for c in caches),
        *(["--dry-run"] if dry_run else []),
    ]
    return jobwire.call(host, "prune", argv=argv)[1]


def failure(what: str, job_id: str, host: str, end: dict) -> JobError:
    """`jobwire.failure_line` as a `JobError`."""
    return JobError(jobwire.failure_line(what, job_id, host, end))


def reattach_hint(host: Host, job_id: str) -> str:
    """What to run to watch job `job_id` on `host` again, after a watch here ended."""
    return f"it keeps running: dflash jobs attach {job_id} --host {host.name}"


# The watch's end line may be as long as the result files it carries.
_END_PREFIX = json.dumps({"event": WATCH_END_EVENT})[:-1].encode()


def watch(
    host: Host,
    job_id: str,
    on_event: EventHandler | None = None,
    offset: int = 0,
    *,
    stream: HostLines | None = None,
    pull: bool = False,
) -> dict:
    """Stream the job's checked events from `offset` to `on_event`; the ``watch_end`` event."""
    job_id = jobwire.local_job_id(job_id)
    lines = stream
    if lines is None:
        argv = jobwire.job_argv(host, "watch", job_id) + ["--offset", str(offset)]
        proc = host.popen(bundle.remote_command(host, argv + (["--pull"] if pull else [])))
        proc.close_stdin()
        lines = HostLines(host.name, proc, "job watch", limit=jobwire.EVENT_MAX)
    lines.what = f"job watch of {job_id}"
    lines.hint = reattach_hint(host, job_id)
    lines.bound(silence=jobwire.WATCH_SILENCE_SECONDS)
    end: dict | None = None
    try:
        while end is None:
            raw = lines.line(jobwire.EVENT_MAX, longer=(_END_PREFIX, jobwire.RESULT_MAX))
            if not raw.endswith(b"\n"):
                break
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("event") == "heartbeat":
                continue
            if event.get("event") == WATCH_END_EVENT:
                end = jobwire.checked(host, "watch_end", event)
                break
            jobwire.checked(host, "event", event)
            if on_event:
                on_event(event)
        code = lines.wait()
    except (OSError, EOFError) as exc:
        lines.kill()
        raise HostError(
            f"{host.name}: lost the connection while watching job {job_id} "
            f"({exc}); {reattach_hint(host, job_id)}"
        ) from None
    except BaseException:
        lines.kill()
        raise
    lines.close()
    if end is None:
        stderr = lines.proc.stderr()
        if code not in (0, -1) and jobwire.said_why(stderr):
            bundle.check_result(host, Result("", stderr, code), ["job watch"])
        raise jobwire.unanswered(host, "watch", job_id, code, stderr)
    return end
