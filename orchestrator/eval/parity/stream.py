"""What ``dflash parity`` moves between its hosts through this machine, verified."""

from __future__ import annotations

import json

from orchestrator.errors import DflashError
from orchestrator.eval import jobwire
from orchestrator.inventory import Inventory
from orchestrator.relay.run import RELAY_PYTHON_FLAGS
from orchestrator.relay.stream import Stream, describe_failure, file_lines, pump, send_request
from orchestrator.transport import bundle
from orchestrator.transport.hosts import Host
from remote.relay.fdfiles import write_all


def copy_ground_truth(b: Host, b_dir: str, a: Host) -> str:
    """B's ground-truth selection, put on A (content-addressed); returns A's path."""
    import hashlib

    raw = jobwire.fetch(b, f"{b_dir}/ground_truth.json", "ground_truth.json", jobwire.ANSWER_MAX)
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("file"), str):
        raise DflashError(f"{b.name}: its capture job names no ground truth file")
    data = jobwire.fetch(b, info["file"], "the ground truth", jobwire.GROUND_TRUTH_MAX)
    sha = hashlib.sha256(data).hexdigest()
    path = f"{a.workdir}/parity/{sha[:16]}-ground_truth.jsonl"
    if not a.has_file(path, sha):
        a.put_bytes(data, path)
    return path


def capture_files(capture: dict, host: str) -> list[str]:
    """The files a capture's result.json names, checked: relative, inside its folder."""
    files = capture.get("files")
    if not isinstance(files, list) or not files:
        raise DflashError(f"{host}: the capture lists no files")
    for f in files:
        if (
            not isinstance(f, str)
            or f.startswith("/")
            or ".." in f.split("/")
            or not f.startswith("capture/")
        ):
            raise DflashError(f"{host}: the capture names a file outside its folder: {f!r}")
    return ["result.json", *files]


def stream_folder(
    inventory: Inventory,
    src: Host,
    src_dir: str,
    files: list[str],
    dest: Host,
    dest_root: str,
    dest_rel: str,
) -> dict[str, str]:
    """Stream `files` from `src_dir` to ``dest_root/dest_rel`` through this machine (never its
    disk), sha256 compared on both ends; file -> sha256, or one line."""

    def start(host: Host, argv: list[str]) -> Stream:
        line = bundle.remote_command(host, argv, python_flags=RELAY_PYTHON_FLAGS)
        return Stream(host, line, inventory, stdin=True, stdout=True)

    s = start(src, ["relay-send"])
    d = start(dest, ["relay-recv", "--", dest_root])
    try:
        try:
            write_all(
                s.stdin_fd,
                json.dumps([{"path": f"{src_dir}/{f}", "offset": 0} for f in files]).encode(),
            )
        except OSError:
            pass  # the source is gone: its exit status says why
        s.close_stdin()
        send_request(d, [{"path": f"{dest_rel}/{f}", "offset": 0} for f in files])
        pump(s, [d], [[0] for _ in files])
    except BaseException:
        s.kill()
        d.kill()
        raise
    scode, _, serr = s.finish()
    dcode, out, derr = d.finish()
    if scode != 0:
        raise DflashError(describe_failure(src, scode, serr))
    if dcode != 0:
        raise DflashError(describe_failure(dest, dcode, derr))
    sent, got = file_lines(serr), file_lines(out.decode(errors="replace"))
    sums = {}
    for i, f in enumerate(files):
        a, b = sent.get(i), got.get(i)
        if not a or not b or a.get("sha256") != b.get("sha256") or a.get("size") != b.get("size"):
            raise DflashError(
                f"{f}: sha256 or size differs between {src.name} and {dest.name}"
                " after streaming; run parity again"
            )
        sums[f] = b["sha256"]
    return sums
