"""`dflash env`: what this machine runs dflash with, for bug reports; versions come from
package metadata (asking about torch must not load it)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from importlib import metadata

import orchestrator
from orchestrator.inventory import locate_inventory

PACKAGES = ("torch", "transformers", "paramiko", "fabric", "typer", "matplotlib")
ZLAB_DFLASH = "dflash"


def package_version(name: str) -> str | None:
    """The installed version of distribution `name`, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def zlab_dflash_version() -> str | None:
    """z-lab's ``dflash`` version, or None (also for this tool installed under that name)."""
    try:
        dist = metadata.distribution(ZLAB_DFLASH)
    except metadata.PackageNotFoundError:
        return None
    if any(ep.value.startswith("orchestrator.") for ep in dist.entry_points):
        return None
    return dist.version


def openssh_version() -> str | None:
    """``ssh -V``, or None without an ssh client."""
    if shutil.which("ssh") is None:
        return None
    try:
        proc = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stderr or proc.stdout).strip() or None


def environment(inventory: str | None = None) -> dict:
    """dflash's, python's, the packages' and OpenSSH's versions, and which inventory is
    used, from where, and whether it exists."""
    path, source = locate_inventory(inventory)
    packages = {name: package_version(name) for name in PACKAGES}
    return {
        "dflash": orchestrator.__version__,
        "dflash_path": str(orchestrator.__path__[0]),
        "distribution": {
            "name": orchestrator.DISTRIBUTION,
            "version": package_version(orchestrator.DISTRIBUTION),
        },
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "in_venv": sys.prefix != sys.base_prefix,
        "platform": platform.platform(),
        "packages": {**packages, ZLAB_DFLASH: zlab_dflash_version()},
        "openssh": openssh_version(),
        "inventory": {"path": str(path.resolve()), "from": source, "exists": path.is_file()},
    }
