"""The ``job`` commands on one host, bounded and checked: what the controller sends, how
long it waits, how much it reads, and what it accepts back.

Every answer is read through `orchestrator.transport.lines` (a size cap per line, a
deadline, and for a watch a silence bound against the host's heartbeat) and checked
against the contract (`remote.protocol.check_job_answer`) before anything uses it: a
host that answers too much, too slowly or the wrong shape ends the command with one line
naming the host and the field. A job id is checked by `local_job_id` before it names a
folder here, as the host checks it before it names one there.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import DflashError, RemoteCommandError
from orchestrator.eval.spec import workdir_for
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

# How much one answer line may hold. A start's answer (with its preflight report), a
# status or a cancel is a few KiB; a list is a row per job (each at most one progress
# event); a watch event carries one sample's record (tens of KiB). The end of a watch with
# --pull, and a pull, carry the result files base64, each sample's record twice (in
# samples.jsonl and events.jsonl): about 28 bytes a completion token at 2 budgets when the
# drafter accepts one token a round (a record's most: every round listed), so 1000 samples
# of 2048 tokens at 4 budgets are about 250 MiB of base64; trained drafters' records are
# a fifth of that.
ANSWER_MAX = 4 * MiB
LIST_MAX = 64 * MiB
EVENT_MAX = 16 * MiB
RESULT_MAX = 512 * MiB
# A ground truth file a host made, pulled to be sliced or copied: 10,000 samples of
# 2048 + 2048 tokens are about 300 MB of JSON.
GROUND_TRUTH_MAX = 1 << 30
# How long a job started before its ground truth is there waits for it (a controller that
# went away must not leave it holding its target for ever).
EARLY_WAIT_SECONDS = 3600.0
# How long each command may take in all (seconds). A start waits for the host checks,
# which the host gives up on after `remote.jobs.start.PREFLIGHT_WAIT_SECONDS` (110 s); a cancel
# for the job's processes to end (a grace period, then KILL); a pull moves the files.
# A prune measures and removes up to a feature cache's many files.
DEADLINES = {
    "start": 170.0,
    "status": 60.0,
    "list": 120.0,
    "cancel": 120.0,
    "pull": 1800.0,
    "prune": 600.0,
}
# A watch has no deadline (a job takes as long as it takes) but the host's watch sends a
# heartbeat every WATCH_HEARTBEAT_SECONDS; this long without a byte, the host is gone.
WATCH_SILENCE_SECONDS = 12 * WATCH_HEARTBEAT_SECONDS


def _limit(action: str) -> int:
    return {"list": LIST_MAX, "prune": LIST_MAX, "pull": RESULT_MAX}.get(action, ANSWER_MAX)


def local_job_id(job_id: object) -> str:
    """`job_id` (the user's or a host's word) if it may name a folder here: the check the
    host makes (`remote.protocol.check_job_id`), as one line."""
    try:
        return check_job_id(job_id)
    except SpecError as exc:
        raise DflashError(str(exc)) from None


_WHAT = {"event": "event from job watch", "watch_end": "end line from job watch"}


def checked(host: Host, action: str, doc: object, job_id: str | None = None) -> Any:
    """`doc`, the host's answer to ``job <action>``, if it has the contract's shape and,
    given `job_id`, is about that job; else one line naming the host and the field."""
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
    # option=value: a value starting with "-" (a job named after such a checkpoint) is
    # then a value, not an option
    argv = ["job", action, f"--workdir={workdir_for(host, [])}"]  # `~`: the host expands it
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
    """Run ``job <action>`` (or `argv`) on `host` with `payload` as JSON on its stdin;
    (its output's lines, kept open only with `keep`, else None; its first line, checked).
    Where this process has not seen the bundle on `host` yet, the command is guarded: a
    host without it runs nothing, and the bundle is pushed and the command sent again."""
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
        lines.bound()  # what follows is read by `watch`, under its own bound
    else:
        code = lines.wait()
        lines.close()
        if code not in (0, -1):  # -1: the channel closed before its status (answered)
            bundle.check_result(host, Result("", lines.proc.stderr(), code), argv)
    return (lines if keep else None), checked(host, action, doc, job_id)


def exit_words(code: int | None) -> str:
    """How a host command ended, in words: the signal that killed it (a local command's
    negative status, or 128 + n), or its exit status; -1: the channel closed without one
    (an SSH command killed by a signal, or a connection cut)."""
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
    """The one-line error for a job command that ended before its answer without saying
    why (its process killed, its connection cut): how it ended and, for a job, what the
    host's ``job status`` says of it now (failed, and why; still running; or gone)."""
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
    """The line for job `job_id` on `host` that ended in `end` (a watch's end or a
    status) other than done: its state, why (its exit record's words, a lost job's
    included) and where its log is on the host."""
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
    """The JSON document on the command's first line (any JSON value); the command's own
    one-line error if it ended without one (`_BundleMissing` where a `guarded` line
    found no bundle)."""
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
    if code not in (0, 126, 127) and not said_why(stderr):  # killed, cut: never an empty line
        raise unanswered(host, action, job_id, code, stderr)
    bundle.check_result(host, Result("", stderr, code or 1), argv)
    raise RemoteCommandError(f"{host.name}: remote {argv[0]} printed no JSON ({raw[:200]!r})")


def fetch(host: Host, path: str, what: str, limit: int) -> bytes:
    """The bytes of file `path` on `host` (`what` names it in messages), at most `limit`
    of them, the host silent no longer than a watch may be."""
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
