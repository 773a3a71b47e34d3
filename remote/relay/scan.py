"""``relay-scan``: what a relay folder holds (stdlib only).

One JSON document: the checkpoints (files per checkpoint, sizes, mtimes), manifests,
partial folders (with where each file's saved hash state lets a resume start), free
space, and what cannot be relayed (links to nothing, names with line breaks), for the
controller to show as refused. The lock holder answers the same scan (`scan_root`), and
``relay-send --scan`` puts one in its ready frame.
"""

from __future__ import annotations

import json
import os
import stat
import time

from remote.relay import states
from remote.relay.wire import MANIFEST, PARTIAL_PREFIX


def shown(name: str) -> str:
    """A name with line breaks, as a scan shows it: ``\\n`` and ``\\r`` for them (no path
    may hold one, `remote.relay.wire.path_problem`, so such an entry is shown, and
    refused, by this name)."""
    return name.replace("\n", "\\n").replace("\r", "\\r")


def _files_under(top: str) -> tuple[list[dict], list[dict]]:
    """(files, what cannot be relayed) under `top`, paths relative to it.

    A symlink that resolves to a regular file is listed with that file's size and mtime
    and ``"link": true``: its content is what gets relayed (the Hugging Face cache
    layout links weight files to blobs outside the snapshot folder). A link that points
    to nothing, to a folder or to something else is listed in the second list with why
    (``{"path", "why", "link"}``, link: whether the entry is itself a symlink), so the
    controller can refuse the checkpoint instead of publishing it without it; so is an
    entry whose name holds a line break (no path may: see `path_problem`), by its
    `shown` name. Reading through
    a link is safe for the relay: the bytes land under the LINK's own name, inside the
    destination's folder, and a link can only expose what the trainer's user could have
    copied into the checkpoint folder anyway.
    """
    out, odd = [], []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in list(dirnames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full):  # os.walk does not enter it
                rel = shown(os.path.relpath(full, top))
                odd.append({"path": rel, "why": "points to a folder", "link": True})
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, top)
            if rel == MANIFEST or name.startswith(".dflash-"):
                continue
            if "\n" in rel or "\r" in rel:  # could not be named on a line: refused by name
                why = "has a line break in its name"
                odd.append({"path": shown(rel), "why": why, "link": os.path.islink(full)})
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            link = stat.S_ISLNK(st.st_mode)
            if link:
                try:
                    st = os.stat(full)
                except OSError:
                    odd.append({"path": rel, "why": "points to nothing", "link": True})
                    continue
            if not stat.S_ISREG(st.st_mode):
                if link:
                    why = "does not point to a regular file"
                    odd.append({"path": rel, "why": why, "link": True})
                continue
            entry = {"path": rel, "size": st.st_size, "mtime": st.st_mtime}
            if link:
                entry["link"] = True
            out.append(entry)
    return out, odd


def _free_bytes(path: str) -> int:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def _kind(path: str) -> str | None:
    """ "dir" or "file" for what `path` is (through a link), None for anything else."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None


def scan(args) -> int:
    """List checkpoints (files per checkpoint, sizes, mtimes), manifests, partials, free
    space, and the entries no line can name (``unnamed``: their `shown` name and kind,
    for the controller to show as refused)."""
    print(json.dumps(scan_root(args.root)))
    return 0


def scan_root(root: str) -> dict:
    """The scan of `root` as printed by ``relay-scan`` (see `scan`)."""
    result = {
        "now": time.time(),
        "root": root,
        "exists": os.path.isdir(root),
        "free": _free_bytes(root),
        "entries": [],
        "partials": {},
        "manifests": {},
    }
    if not result["exists"]:
        return result
    for name in sorted(os.listdir(root)):
        full = os.path.join(root, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if "\n" in name or "\r" in name:  # no line can carry it: shown, and refused
            kind = _kind(full)
            if kind is not None and not name.startswith("."):
                result.setdefault("unnamed", []).append({"name": shown(name), "kind": kind})
            continue
        if name.startswith(PARTIAL_PREFIX) and stat.S_ISDIR(st.st_mode) and name != PARTIAL_PREFIX:
            files, odd = _files_under(full)
            states.mark_resumable(full, files)  # "resume": where a saved hash state is
            result["partials"][name[len(PARTIAL_PREFIX) :]] = files
            if odd:
                result.setdefault("partial_odd", {})[name[len(PARTIAL_PREFIX) :]] = odd
            continue
        if name.startswith(".") and name.endswith(MANIFEST) and name != MANIFEST:
            # manifest of a single-file checkpoint: ".<name>.dflash-manifest.json"
            result["manifests"][name[1 : -len(MANIFEST)]] = read_json(full)
            continue
        if name.startswith("."):
            continue
        if stat.S_ISLNK(st.st_mode):  # a checkpoint that is itself a link: its target
            try:
                st = os.stat(full)
            except OSError:
                continue
        if stat.S_ISDIR(st.st_mode):
            files, odd = _files_under(full)
            entry = {"name": name, "kind": "dir", "files": files}
            if odd:
                entry["odd"] = odd
            manifest = os.path.join(full, MANIFEST)
            if os.path.isfile(manifest):
                result["manifests"][name] = read_json(manifest)
        elif stat.S_ISREG(st.st_mode):
            entry = {
                "name": name,
                "kind": "file",
                "files": [{"path": name, "size": st.st_size, "mtime": st.st_mtime}],
            }
        else:
            continue
        result["entries"].append(entry)
    return result


def read_json(path: str):
    """The JSON document in file `path` (a manifest, the lock's holder file), or None
    when it cannot be read or parsed."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None  # unreadable manifest: treated as "not relayed", so it gets redone


def register(sub) -> None:
    # The controller puts every positional argument after "--": a checkpoint or folder
    # name starting with "-" is then a name, not an option.
    p = sub.add_parser("relay-scan", help="list checkpoints, manifests, partials, free space")
    p.add_argument("root")
    p.set_defaults(func=scan)
