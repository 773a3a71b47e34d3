"""``relay-scan``: what a relay folder holds, as one JSON document (stdlib only)."""

from __future__ import annotations

import json
import os
import stat
import time

from remote.relay import states
from remote.relay.wire import MANIFEST, PARTIAL_PREFIX


def shown(name: str) -> str:
    """`name` with ``\\n`` and ``\\r`` for its line breaks: shown, and refused, so."""
    return name.replace("\n", "\\n").replace("\r", "\\r")


def _files_under(top: str) -> tuple[list[dict], list[dict]]:
    """(files, what cannot be relayed and why) under `top`: docs/relay.md, "Symlinks"."""
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
            if "\n" in rel or "\r" in rel:
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
    try:
        st = os.stat(path)
    except OSError:
        return None
    return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None


def scan(args) -> int:
    print(json.dumps(scan_root(args.root)))
    return 0


def scan_root(root: str) -> dict:
    """The scan of `root`: checkpoints, manifests, partials, free space, ``unnamed``."""
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
        if "\n" in name or "\r" in name:
            kind = _kind(full)
            if kind is not None and not name.startswith("."):
                result.setdefault("unnamed", []).append({"name": shown(name), "kind": kind})
            continue
        if name.startswith(PARTIAL_PREFIX) and stat.S_ISDIR(st.st_mode) and name != PARTIAL_PREFIX:
            files, odd = _files_under(full)
            states.mark_resumable(full, files)
            result["partials"][name[len(PARTIAL_PREFIX) :]] = files
            if odd:
                result.setdefault("partial_odd", {})[name[len(PARTIAL_PREFIX) :]] = odd
            continue
        if name.startswith(".") and name.endswith(MANIFEST) and name != MANIFEST:
            result["manifests"][name[1 : -len(MANIFEST)]] = read_json(full)
            continue
        if name.startswith("."):
            continue
        if stat.S_ISLNK(st.st_mode):
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
    """The JSON document in file `path`, or None."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None  # an unreadable manifest means "not relayed": it gets redone


def register(sub) -> None:
    # Positional arguments come after "--": a name starting with "-" is a name.
    p = sub.add_parser("relay-scan", help="list checkpoints, manifests, partials, free space")
    p.add_argument("root")
    p.set_defaults(func=scan)
