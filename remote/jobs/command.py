"""The ``job`` command line; each action imports only the room that runs it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from remote.errors import UserError


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _cmd(args: argparse.Namespace) -> int:
    action = args.action
    if action == "start":
        from remote.jobs.start import start

        data = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
        try:
            spec = json.loads(data)
        except ValueError as exc:
            raise UserError(f"job spec is not JSON: {exc}") from None
        info = start(args.workdir, args.job_id, spec, args.preflight)
        _print(json.dumps(info))
        if args.follow:
            _watch(Path(info["dir"]), 0, args.pull)
        return 0
    if action == "run":
        from remote.jobs.supervise import supervise

        return supervise(Path(args.dir), args.preflight)
    if action == "array":
        from remote.jobs.array import run_task

        if not args.job_id or not args.dir:
            raise UserError("job array needs --job-id (the prefix) and --dir (the specs)")
        return run_task(args.workdir, args.job_id, args.dir)
    if action == "array-end":
        from remote.jobs.slurm_end import record_end

        data = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
        try:
            end = json.loads(data)
        except ValueError as exc:
            raise UserError(f"job array-end: the attempt's end is not JSON: {exc}") from None
        _print(json.dumps(record_end(args.workdir, args.job_id, end)))
        return 0
    from remote.jobs import folder

    if action == "watch":
        _watch(folder.existing_job_dir(args.workdir, args.job_id), args.offset, args.pull)
    elif action == "pull":
        path = folder.existing_job_dir(args.workdir, args.job_id)
        _print(json.dumps({**folder.job_state(path), "files": folder.result_files(path)}))
    elif action == "status":
        _print(json.dumps(folder.job_state(folder.existing_job_dir(args.workdir, args.job_id))))
    elif action == "cancel":
        from remote.jobs.cancel import cancel

        _print(json.dumps(cancel(folder.existing_job_dir(args.workdir, args.job_id))))
    elif action == "list":
        _print(json.dumps(folder.list_jobs(args.workdir)))
    elif action == "prune":
        from remote.jobs.prune import prune

        _print(json.dumps(prune(args.workdir, args.older_than, args.cache, args.dry_run)))
    return 0


def _watch(path: Path, offset: int, pull: bool) -> None:
    from remote.jobs.watch import watch

    try:
        watch(path, offset, _print, pull=pull)
    except BrokenPipeError:  # the controller went away, not the job
        os._exit(0)


def register(sub) -> None:
    p = sub.add_parser("job", help="start, watch, cancel and list detached jobs")
    p.add_argument(
        "action",
        choices=[
            "start",
            "run",
            "array",
            "array-end",
            "watch",
            "status",
            "pull",
            "cancel",
            "list",
            "prune",
        ],
    )
    p.add_argument("--workdir", default="~/.dflash")
    p.add_argument("--job-id")
    p.add_argument(
        "--spec", default="-", help="job spec JSON file, or - for stdin (array-end: the end)"
    )
    p.add_argument("--dir", help="job folder (run); the tasks' specs folder (array)")
    p.add_argument("--offset", type=int, default=0, help="byte offset into events (watch)")
    p.add_argument(
        "--preflight",
        action="store_true",
        help="run the host checks first; start waits for them (start, run)",
    )
    p.add_argument("--follow", action="store_true", help="after starting, watch the job (start)")
    p.add_argument(
        "--pull",
        action="store_true",
        help="end the watch with the result files, base64 (watch, start --follow)",
    )
    p.add_argument(
        "--older-than", type=float, default=0.0, help="seconds since a folder's last write (prune)"
    )
    p.add_argument(
        "--cache",
        action="append",
        default=[],
        choices=["ground-truth", "features"],
        help="also prune this cache (prune; repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    p.set_defaults(func=_cmd)
