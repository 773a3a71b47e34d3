"""``facts``: what a host is, as JSON: OS, CPUs, memory, disk, python and ML packages.

Versions come from metadata, not imports: importing torch would take seconds.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import sys

PACKAGES = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "safetensors": ("safetensors",),
    "fla": ("flash-linear-attention", "fla-core", "fla"),
    "causal_conv1d": ("causal-conv1d", "causal_conv1d"),
}


def package_version(module: str, dists: tuple[str, ...]) -> str | None:
    """The installed version of an importable module, or None."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def meminfo() -> dict[str, int]:
    """Total and available RAM in bytes (zeros where unknown)."""
    out = {"total": 0, "available": 0}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    out["total"] = int(rest.split()[0]) * 1024
                elif key == "MemAvailable":
                    out["available"] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def disk_free(path: str) -> int | None:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    probe = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    return shutil.disk_usage(probe).free


def collect(workdir: str) -> dict:
    uname = platform.uname()
    return {
        "os": f"{uname.system} {uname.release}",
        "machine": uname.machine,
        "cpus": os.cpu_count(),
        "memory": meminfo(),
        "workdir": workdir,
        "disk_free": disk_free(workdir),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "packages": {name: package_version(name, dists) for name, dists in PACKAGES.items()},
    }


def run(args) -> int:
    print(json.dumps(collect(args.workdir)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("facts", help="print host facts as JSON")
    p.add_argument("--workdir", default=".")
    p.set_defaults(func=run)
