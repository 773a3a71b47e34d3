"""``relay-lock``: a relay folder's lock, held while the controller's channel is open, and
the questions the holder answers on it (scan, hash, publish, a batch to receive).
"""

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

LOCK = ".dflash-relay.lock"  # who holds the lock, while it is held


def hold_lock(args) -> int:
    """Take `root`'s relay lock, print its scan, and hold the lock until stdin closes.

    One relay at a time may write into a drafters folder: two would share the partial
    folders, and the slower one could publish a checkpoint whose files the faster one had
    already moved into place. The lock is an flock of the folder itself by this process,
    so it ends with the relay's connection (stdin at EOF, or this process killed) and is
    never left behind; ``.dflash-relay.lock`` beside it names the holder while it is held.
    A filesystem without flock gets no lock. Prints one JSON line: ``{"locked": true,
    "scan": {...}}`` (the `scan_root` of `root`, taken under the lock) or
    ``{"locked": false, "holder": {...}}`` when another relay still holds it after
    `wait` seconds.
    """
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
        # Ours while we hold the lock: replace whatever is there, never write through a link.
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
    """Lock `fd` exclusively, waiting at most `seconds` for another holder to let go; the
    lock is taken the moment it does (a blocking flock cut short by a timer, not polls).
    True also where the filesystem has no flock (some network filesystems): unguarded."""
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
    """Answer the controller's requests about `root`, one JSON line each, until EOF.

    The lock holder serves them on its open channel, so each costs a line each way instead
    of a new SSH session, shell and interpreter (a tenth of a second or more per command
    on a host whose shell start-up is slow). A request is ``{"op": "publish", "name": N,
    "kind": K, "manifest": {...}}`` (see `publish_checkpoint`), ``{"op": "hash",
    "requests": [...]}`` (see `hash_requests`), ``{"op": "scan"}`` or ``{"op": "recv"}``;
    the folder is always `root`, never one the request names. The answer is the
    command's JSON document, or ``{"error": "one line"}``.

    ``{"op": "ping"}`` is answered ``{"pong": true}``: with `patience` (a deadline on the
    controller's silence, `remote.relay.patience`), the controller pings an idle holder,
    and a holder that hears nothing for that long (the controller vanished without
    closing its connection) ends, and its lock with it.

    ``recv`` receives one batch of files on this channel, exactly as ``relay-recv ROOT``
    does (`recv`: its ``{"ready": true}`` line, then the request frame and one frame per
    file on stdin, a line per file once durable), then ``{"done": true}``: a
    destination's first stream needs no SSH session or interpreter of its own, and an
    unchanged relay runs ONE command there. The controller sends the frames only after
    that ready line, so no frame byte sits in this reader's buffer. A batch that fails
    ends with ``{"done": true, "error": "one line"}`` and ends this holder, and so the
    lock: its stream may have stopped inside a frame, where no later line could be told
    from payload.
    """
    call = patience.call if patience is not None else unbounded
    while line := call(requests.readline):
        try:
            req = json.loads(line)
            op = req.get("op") if isinstance(req, dict) else None
            # Each op's module is imported at its first request: the lock's answer, the scan,
            # waits for none of them, and an unchanged relay asks for none.
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
    """What `recv` reads of its arguments, for a batch received by `serve` (with the
    holder's own `Patience`, if any)."""

    def __init__(self, root: str, waiter=None):
        self.root = root
        self.waiter = waiter


def register(sub) -> None:
    # The controller puts every positional argument after "--": a checkpoint or folder
    # name starting with "-" is then a name, not an option.
    p = sub.add_parser("relay-lock", help="hold the relay lock of a folder until stdin closes")
    p.add_argument("root")
    p.add_argument("--by", default="", help="who holds it, for the message another relay shows")
    p.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the lock")
    p.add_argument("--patience", type=float, default=PATIENCE, help=PATIENCE_HELP)
    p.set_defaults(func=hold_lock)
