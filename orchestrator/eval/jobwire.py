"""The ``job`` commands on one host, bounded and their answers checked before use."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval.uploads import workdir_for
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host, HostError, Result, last_line
from orchestrator.transport.lines import HostLines, MiB
from remote.protocol import (
    WATCH_HEARTBEAT_SECONDS,
    AnswerError,
    JobState,
    SpecError,
    check_job_answer,
    check_job_id,
)

# How much one answer line may hold; sized in docs/eval.md ("Answer sizes").
ANSWER_MAX = 4 * MiB
LIST_MAX = 64 * MiB
EVENT_MAX = 16 * MiB
RESULT_MAX = 512 * MiB
GROUND_TRUTH_MAX = 1 << 30
# A controller that went away must not leave a deferred job holding its target for ever.
EARLY_WAIT_SECONDS = 3600.0
# Each command's whole deadline; a start outlasts the host's own preflight wait.
DEADLINES = {
    "start": 170.0,
    "status": 60.0,
    "list": 120.0,
    "cancel": 120.0,
    "pull": 1800.0,
    "prune": 600.0,
}
# A watch has no deadline; silence this long against the host's heartbeat means it is gone.
WATCH_SILENCE_SECONDS = 12 * WATCH_HEARTBEAT_SECONDS


def _limit(action: str) -> int:
    return {"list": LIST_MAX, "prune": LIST_MAX, "pull": RESULT_MAX}.get(action, ANSWER_MAX)


def local_job_id(job_id: object) -> str:
    """`job_id` if it may name a folder here (the host's own check), else one line."""
    try:
        return check_job_id(job_id)
    except SpecError as exc:
        raise DflashError(str(exc)) from None


_WHAT = {"event": "event from job watch", "watch_end": "end line from job watch"}


def checked(host: Host, action: str, doc: object, job_id: str | None = None) -> Any:
    """`doc`, the answer to ``job <action>``, if it has the contract's shape; else one line."""
    try:
        check_job_answer(action, doc)
    except AnswerError as exc:
        what = _WHAT.get(action, f"answer to job {action}")
        raise RemoteCommandError(f"{host.name}: bad {what}: {exc}") from None
    if job_id is not None and isinstance(doc, dict) and doc.get("job_id") != job_id:
        raise RemoteCommandError(
            f"{host.name}: bad answer to job {action}: it is about job "
            f"{doc['job_id']}, not {job_id}"
        )
    return doc


def job_argv(host: Host, action: str, job_id: str | None = None) -> list[str]:
    """A ``job <action>`` command line for `host`'s bundle."""
    # option=value: a job id starting with "-" stays a value
    argv = ["job", action, f"--workdir={workdir_for(host, [])}"]
    return argv + ([f"--job-id={job_id}"] if job_id else [])


def call(
    host: Host,
    action: str,
    job_id: str | None = None,
    *,
    argv: Sequence[str] | None = None,
    payload: dict | None = None,
    keep: bool = False,
) -> tuple[HostLines | None, Any]:
    """Run ``job <action>`` on `host` (bundle pushed if missing): (lines, checked first line)."""
    argv = list(argv or job_argv(host, action, job_id))
    data = json.dumps(payload).encode() if payload is not None else None
    line, guarded = bundle.first_line(host, argv)
    while True:
        lines = HostLines(host.name, host.popen(line), f"job {action}", limit=ANSWER_MAX)
        lines.bound(deadline=DEADLINES[action])
        try:
            if data is not None:
                lines.proc.write(data)
            lines.proc.close_stdin()
        except OSError:  # a guarded line that found no bundle may be gone already
            pass
        try:
            doc = _first_json(host, lines, argv, guarded, _limit(action), action, job_id)
        except _BundleMissing:
            line, guarded = bundle.remote_command(host, argv), False
            continue
        except BaseException:
            lines.kill()
            raise
        break
    if keep:
        lines.bound()
    else:
        code = lines.wait()
        lines.close()
        if code not in (0, -1):
            bundle.check_result(host, Result("", lines.proc.stderr(), code), argv)
    return (lines if keep else None), checked(host, action, doc, job_id)


def exit_words(code: int | None) -> str:
    """How a host command ended, in words: the signal that killed it, or its exit status."""
    if code is None or code == -1:
        return "its channel closed without an exit status: killed, or the connection cut"
    if code < 0 or 128 < code < 128 + 65:
        signum = -code if code < 0 else code - 128
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"killed by {name}" if code < 0 else f"exit {code}: killed by {name}?"
    return f"exit {code}"


def unanswered(host: Host, action: str, job_id: str | None, code: int, stderr: str):
    """The one-line error for a job command cut off before its answer, with the job's status now."""
    said = last_line(stderr)
    how = f"{host.name}: job {action}{f' of {job_id}' if job_id else ''} ended before it "
    how += f"answered ({exit_words(code)}{f': {said}' if said else ''})"
    if job_id is None:
        return RemoteCommandError(how)
    try:
        status = call(host, "status", job_id)[1]
    except DflashError as exc:
        return HostError(
            f"{how}; its status could not be read either ({exc}); if it runs, watch it "
            f"again with dflash jobs attach {job_id} --host {host.name}"
        )
    state = status["state"]
    if state in (JobState.RUNNING, JobState.STARTING):
        return HostError(
            f"{how}; the job keeps running: dflash jobs attach {job_id} --host {host.name}"
        )
    if state == JobState.DONE:
        return HostError(
            f"{how}; the job is done: dflash jobs attach {job_id} --host {host.name} "
            "pulls its result"
        )
    return RemoteCommandError(f"{how}; {failure_line('the job', job_id, host.name, status)}")


def failure_line(what: str, job_id: str, host: str, end: dict) -> str:
    """The line for a job that ended in `end` other than done: state, why, where its log is."""
    record = end.get("exit") if isinstance(end.get("exit"), dict) else {}
    err = record.get("error")
    line = f"{what} {job_id} on {host} {end['state']}: {err or 'it recorded no reason'}"
    log = record.get("log") or (f"{end['dir']}/log.txt" if end.get("dir") else None)
    if log and str(log) not in line:
        line += f" (log on {host}: {log})"
    return line


def said_why(stderr: str) -> bool:
    """Whether a failed bundle command's `stderr` holds its own one-line error."""
    return any(ln.startswith(bundle.ERROR_PREFIX) for ln in stderr.splitlines())


class _BundleMissing(Exception):
    """A guarded command (`bundle.first_line`) found no bundle on the host."""


def _first_json(
    host: Host,
    lines: HostLines,
    argv: Sequence[str],
    guarded: bool,
    limit: int,
    action: str,
    job_id: str | None,
):
    """The JSON on the command's first line, else the command's own one-line error."""
    raw = lines.line(limit)
    try:
        doc = json.loads(raw)
    except ValueError:
        pass
    else:
        if guarded:
            bundle.seen(host)
        return doc
    code = lines.wait()
    stderr = lines.proc.stderr()
    if guarded and bundle.was_missing(host, code, stderr):
        raise _BundleMissing()
    if code not in (0, 126, 127) and not said_why(stderr):
        raise unanswered(host, action, job_id, code, stderr)
    bundle.check_result(host, Result("", stderr, code or 1), argv)
    raise RemoteCommandError(f"{host.name}: remote {argv[0]} printed no JSON ({raw[:200]!r})")


def fetch(host: Host, path: str, what: str, limit: int) -> bytes:
    """The bytes of file `path` on `host`, at most `limit`, silent no longer than a watch."""
    lines = HostLines(host.name, host.popen(["cat", "--", path]), f"{what} {path}", limit=limit)
    lines.bound(silence=WATCH_SILENCE_SECONDS)
    lines.proc.close_stdin()
    try:
        data = lines.read_all(limit)
        code = lines.wait()
    finally:
        lines.kill()
    if code != 0:
        raise RemoteCommandError(
            f"{host.name}: could not read {what} ({path}): {last_line(lines.proc.stderr())}"
        )
    return data
