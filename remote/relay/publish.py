"""``relay-publish``: a verified partial checkpoint made visible with one rename (stdlib only)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

from remote.errors import UserError
from remote.relay import states
from remote.relay.fdfiles import open_dirs, open_root, write_new
from remote.relay.wire import MANIFEST, PARTIAL_PREFIX, name_problem, path_problem


def publish(args) -> int:
    """Publish a verified partial checkpoint with one rename; JSON manifest on stdin."""
    print(json.dumps(publish_checkpoint(args.root, args.name, args.kind, json.load(sys.stdin))))
    return 0


def publish_checkpoint(root: str, name, kind, manifest) -> dict:
    """Publish partial checkpoint `name` under `root`; ``{"published": path}``."""
    if kind not in ("dir", "file") or not isinstance(manifest, dict):
        raise UserError(f"refusing to publish {name!r}: malformed request")
    why = name_problem(name)
    if why is not None:
        raise UserError(f"refusing to publish {name!r}: the name {why}")
    pname = PARTIAL_PREFIX + name
    partial = os.path.join(root, pname)
    root_fd = open_root(root)
    try:
        try:
            pfd = os.open(pname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError:
            raise UserError(f"nothing to publish: {partial} is missing or not a folder") from None
        try:
            for f in manifest.get("files", []):
                _settle(pfd, f, name, partial)
            states.remove_sidecars(pfd)
            data = json.dumps(manifest, indent=2).encode()
            if kind == "dir":
                write_new(pfd, MANIFEST, data)
            else:
                write_new(root_fd, f".{name}{MANIFEST}", data)
        finally:
            os.close(pfd)
        old = None
        try:
            os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            old = f".old-{name}-{os.getpid()}"
            os.rename(name, old, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        except FileNotFoundError:
            pass
        if kind == "dir":
            os.rename(pname, name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        else:
            os.rename(f"{pname}/{name}", name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            shutil.rmtree(partial, ignore_errors=True)
        try:
            os.fsync(root_fd)
        except OSError:
            pass
    finally:
        os.close(root_fd)
    if old:
        old = os.path.join(root, old)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)
    return {"published": os.path.join(root, name)}


def _settle(pfd: int, f: dict, name: str, partial: str) -> None:
    """Check one manifest file at full size, set its mtime and record the one it then has."""
    rel = f.get("path")
    why = path_problem(rel)
    if why is not None:
        raise UserError(f"refusing to publish {name}: the manifest path {rel!r} {why}")
    parts = rel.split("/")
    size = None
    try:
        dfd = open_dirs(pfd, parts[:-1], False, f"{PARTIAL_PREFIX}{name}/{rel}")
    except OSError:
        dfd = None
    if dfd is not None:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UserError(
                    f"refusing to publish {name}: {rel} in {partial} is a "
                    "symlink; remove it and run the relay again"
                )
            if stat.S_ISREG(st.st_mode):
                size = st.st_size
            if size == f.get("size") and isinstance(f.get("mtime"), (int, float)):
                os.utime(parts[-1], (f["mtime"], f["mtime"]), dir_fd=dfd, follow_symlinks=False)
                f["stored_mtime"] = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)
    # The last guard of "never half a checkpoint", whatever happened since verification.
    if size != f.get("size"):
        raise UserError(
            f"{name} is not published: {rel} holds "
            f"{'nothing' if size is None else f'{size} bytes'} in {partial}, "
            f"not {f.get('size')}; run the relay again"
        )


def register(sub) -> None:
    # Positional arguments come after "--": a name starting with "-" is a name.
    p = sub.add_parser("relay-publish", help="publish a partial checkpoint by rename")
    p.add_argument("root")
    p.add_argument("name")
    p.add_argument("--kind", choices=("dir", "file"), required=True)
    p.set_defaults(func=publish)
