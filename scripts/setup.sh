#!/usr/bin/env bash
# Install what dflash, its demo and its tests need on a fresh Debian/Ubuntu machine, into the
# project's own virtual environment `.venv` (never into the system Python, which PEP 668
# marks externally managed on Debian 12+/Ubuntu 23.04+). Idempotent: a second run installs
# nothing new.
#
#   PYTHON=/usr/bin/python3 bash scripts/setup.sh   # the interpreter the venv is made from
#                                                   # (default: python3 on PATH; system,
#                                                   # pyenv or conda Pythons all work)
#   DFLASH_VENV=DIR                                 # another venv folder (default: .venv)
#   DFLASH_TORCH_INDEX=URL                          # a CPU torch index (default: PyTorch's)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TORCH_VERSION=2.13.0
TORCH_INDEX=${DFLASH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
VENV=${DFLASH_VENV:-.venv}
BASE=${PYTHON:-python3}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

apt_install() {
  command -v apt-get >/dev/null || die "missing $*; install it with your package manager"
  if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
    die "missing $*; run as root or install sudo"
  fi
  if [ -z "${_APT_UPDATED:-}" ]; then
    $SUDO apt-get update -qq
    _APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# -- system packages ------------------------------------------------------------------------
if ! [ -x /usr/sbin/sshd ] || ! command -v ssh-keygen >/dev/null || ! command -v scp >/dev/null
then
  say "installing OpenSSH (server for the tests' loopback hosts, client for the relay)"
  apt_install openssh-server openssh-client
fi

# Chromium: tests/test_results.py renders the HTML report in a real headless browser.
if ! command -v chromium >/dev/null; then
  say "installing Chromium (the HTML report's browser test)"
  apt_install chromium
fi

if ! command -v "$BASE" >/dev/null; then
  [ "$BASE" = python3 ] || die "no Python at '$BASE'; install it or leave PYTHON unset"
  say "installing python3 (and its venv support)"
  apt_install python3 python3-venv
fi
"$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "$BASE is Python $("$BASE" -c 'import platform; print(platform.python_version())'); dflash needs 3.10+"
BASE_REAL=$("$BASE" -c 'import os, sys; print(os.path.realpath(sys.executable))')

# -- the venv -------------------------------------------------------------------------------
# Made anew when missing, broken, or made from another interpreter than $PYTHON names
# (without $PYTHON a working venv is kept, whatever it was made from).
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c 'import sys' 2>/dev/null && { [ -z "${PYTHON:-}" ] \
    || [ "$(cat "$VENV/.dflash-base" 2>/dev/null)" = "$BASE_REAL" ]; }; then
  :
else
  # Debian/Ubuntu ship venv's pip bootstrap (ensurepip) in a separate package.
  if ! "$BASE" -c 'import ensurepip, venv' 2>/dev/null; then
    ver=$("$BASE" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    say "installing python${ver}-venv (venv support for $BASE_REAL)"
    apt_install "python${ver}-venv" || apt_install python3-venv
  fi
  say "creating $VENV from $BASE_REAL"
  rm -rf "$VENV"
  "$BASE" -m venv "$VENV"
  echo "$BASE_REAL" > "$VENV/.dflash-base"
fi
PIP=("$PY" -m pip -q --disable-pip-version-check)
# pip 22.2+ for `install --dry-run --report` below (Ubuntu 22.04's venv brings 22.0).
if ! "$PY" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 2))'
then
  say "upgrading pip in $VENV"
  "${PIP[@]}" install --upgrade "pip>=23"
fi

# -- torch, CPU build, first and pinned ------------------------------------------------------
# An unpinned torch, or PyPI's Linux wheel, is the CUDA build and its multi-GB dependencies.
torch_ok() {  # from its metadata (importing torch costs seconds): the version, no CUDA deps
  "$PY" - "$TORCH_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib import metadata
dist = metadata.distribution("torch")
cuda = [r for r in dist.requires or [] if r.startswith(("nvidia-", "triton"))]
sys.exit(0 if dist.version.split("+")[0] == sys.argv[1] and not cuda else 1)
EOF
}
index_reachable() {  # a quick look: an unreachable index must not cost pip's long retries
  "$PY" - "$1" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
EOF
}
if ! torch_ok; then
  if index_reachable "$TORCH_INDEX"; then
    say "installing torch $TORCH_VERSION (CPU) from $TORCH_INDEX"
    "${PIP[@]}" install --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"
  else
    # Without the CPU index: only a wheel this machine's pip finds (a mirror, find-links)
    # that is a CPU build. Ask pip which one it would take before it downloads anything.
    chosen=$("${PIP[@]}" install --dry-run --no-deps --report - "torch==$TORCH_VERSION" \
             2>/dev/null | "$PY" -c '
import json, sys, urllib.parse
items = json.load(sys.stdin).get("install", [])
print(urllib.parse.unquote(items[0]["download_info"]["url"]) if items else "")' || true)
    case "$chosen" in
      *+cpu*|*macosx*|*win_amd64*)
        say "installing torch $TORCH_VERSION (CPU) from pip's own sources (${chosen%%\?*})";;
      "") die "torch $TORCH_VERSION not found: $TORCH_INDEX is unreachable and pip has no" \
              "wheel for it; make the index reachable or set DFLASH_TORCH_INDEX";;
      *) die "$TORCH_INDEX is unreachable and pip would install a CUDA torch" \
             "(${chosen##*/}); make the index reachable or set DFLASH_TORCH_INDEX";;
    esac
    "${PIP[@]}" install "torch==$TORCH_VERSION"
  fi
  torch_ok || die "torch in $VENV is not the CPU build of $TORCH_VERSION"
fi

# -- dflash ---------------------------------------------------------------------------------
# This checkout, editable, with its extras: done again only when pyproject.toml changed or the
# venv's dflash is another checkout's (a stamp records both), so a second run costs a second.
stamp="$(pwd) $("$PY" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
installed=$("$PY" -c 'import os, orchestrator; print(os.path.dirname(os.path.dirname(orchestrator.__file__)))' 2>/dev/null || true)
if [ "$(cat "$VENV/.dflash-installed" 2>/dev/null)" != "$stamp" ] || [ "$installed" != "$(pwd)" ]; then
  say "installing dflash (this checkout) with its eval, plot and test extras into $VENV"
  "${PIP[@]}" install -e '.[dev]'
  echo "$stamp" > "$VENV/.dflash-installed"
fi
say "ready: $VENV/bin/dflash (python $("$PY" -c 'import platform; print(platform.python_version())'), torch $("$PY" -c 'from importlib.metadata import version; print(version("torch"))'))"
