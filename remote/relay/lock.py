"""``relay-lock``: a relay folder's lock, held while the controller's channel is open, and
the questions the holder answers on it."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time

from remote.errors import UserError
from remote.relay.pipes import PATIENCE_HELP, emit, patience_of
from remote.relay.scan import read_json, scan_root
from remote.relay.wire import PATIENCE, unbounded

LOCK = ".dflash-relay.lock"  # names the holder while the lock is held


def hold_lock(args) -> int:
    """Take `root`'s relay lock (an flock that ends with the connection), print its scan,
    and answer requests until stdin closes (docs/relay.md, "Atomicity")."""
    root = args.root
    info = os.path.join(root, LOCK)
    try:
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise UserError(f"cannot use {root}: {exc.strerror}") from None
    if not _flock_within(fd, args.wait):
        print(json.dumps({"locked": False, "holder": read_json(info) or {}}), flush=True)
        return 0
    try:
        # Never write through a link.
        try:
            os.unlink(info)
        except FileNotFoundError:
            pass
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w") as fh:
            json.dump({"by": args.by, "pid": os.getpid(), "since": time.time()}, fh)
        print(json.dumps({"locked": True, "scan": scan_root(root)}), flush=True)
        serve(root, sys.stdin.buffer, sys.stdout, patience_of(args))
    finally:
        try:
            os.unlink(info)
        except OSError:
            pass
    return 0


def _flock_within(fd: int, seconds: float) -> bool:
    """Lock `fd`, waiting at most `seconds`; True also where the filesystem has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if seconds <= 0:
            return False
    except OSError:
        return True

    def expire(*_) -> None:
        raise TimeoutError

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def serve(root: str, requests, answers, patience=None) -> None:
    """Answer the controller's requests about `root`, one JSON line each, until EOF. A
    failed batch ends the holder and its lock: its stream may have stopped inside a frame."""
    call = patience.call if patience is not None else unbounded
    while line := call(requests.readline):
        try:
            req = json.loads(line)
            op = req.get("op") if isinstance(req, dict) else None
            if op == "recv":
                from remote.relay.receive import recv

                try:
                    recv(_RecvArgs(root, patience))
                except UserError as exc:
                    emit(answers, {"done": True, "error": str(exc)})
                    return
                except OSError as exc:
                    what = (exc.strerror or str(exc)).lower()
                    emit(answers, {"done": True, "error": f"{what} in {root}"})
                    return
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    emit(
                        answers, {"done": True, "error": f"malformed batch ({type(exc).__name__})"}
                    )
                    return
                emit(answers, {"done": True})
                continue
            if op == "ping":
                answer = {"pong": True}
            elif op == "publish":
                from remote.relay.publish import publish_checkpoint

                answer = publish_checkpoint(root, req.get("name"), req.get("kind"), req["manifest"])
            elif op == "hash":
                from remote.relay.hashes import hash_requests

                answer = {"hashes": hash_requests(req["requests"])}
            elif op == "scan":
                answer = {"scan": scan_root(root)}
            else:
                raise UserError(f"unknown request {op!r}")
        except UserError as exc:
            answer = {"error": str(exc)}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            answer = {"error": f"malformed request ({type(exc).__name__})"}
        except OSError as exc:
            answer = {"error": f"{(exc.strerror or str(exc)).lower()} in {root}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class _RecvArgs:
    def __init__(self, root: str, waiter=None):
        self.root = root
        self.waiter = waiter


def register(sub) -> None:
    # Positional arguments come after "--": a name starting with "-" is a name.
    p = sub.add_parser("relay-lock", help="hold the relay lock of a folder until stdin closes")
    p.add_argument("root")
    p.add_argument("--by", default="", help="who holds it, for the message another relay shows")
    p.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the lock")
    p.add_argument("--patience", type=float, default=PATIENCE, help=PATIENCE_HELP)
    p.set_defaults(func=hold_lock)
