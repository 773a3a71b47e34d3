#!/usr/bin/env bash
# Install Slurm (Debian/Ubuntu's slurm-wlm) and MUNGE for tests/test_slurm.py, whose
# fixture (tests/helpers/slurm.py) starts its own munged, slurmctld and slurmd on loopback
# in a temp folder: nothing here configures or starts a service. Idempotent: with every
# program present it installs nothing.
#
#   DFLASH_APT_LOCK_WAIT=SECONDS   how long to wait for another apt/dpkg to let go of its
#                                  lock (default 300); then this fails, saying so
set -euo pipefail

WAIT=${DFLASH_APT_LOCK_WAIT:-300}
PROGRAMS=(munged slurmctld slurmd sbatch squeue scancel scontrol sinfo)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

say() { echo "setup-slurm: $*"; }
die() { echo "setup-slurm: error: $*" >&2; exit 1; }

missing=()
for p in "${PROGRAMS[@]}"; do
  command -v "$p" >/dev/null || [ -x "/usr/sbin/$p" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "ready: $(/usr/sbin/slurmd -V 2>/dev/null || echo slurm), $(/usr/sbin/munged -V 2>/dev/null | head -n1)"
  exit 0
fi
command -v apt-get >/dev/null || die "missing ${missing[*]}; install slurm-wlm and munge with your package manager"
if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
  die "missing ${missing[*]}; run as root or install sudo"
fi

# apt-get, retried while another apt or dpkg holds a lock, for at most $WAIT seconds in all.
deadline=$(( $(date +%s) + WAIT ))
apt() {
  local err
  err=$(mktemp)
  while true; do
    if DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o "DPkg::Lock::Timeout=$WAIT" "$@" \
        >/dev/null 2>"$err"; then
      rm -f "$err"
      return 0
    fi
    if grep -qE 'Could not get lock|Unable to lock|is another process using it' "$err" \
        && [ "$(date +%s)" -lt "$deadline" ]; then
      sleep 5
      continue
    fi
    local why
    why=$(grep -v '^W:' "$err" | tail -n1)
    rm -f "$err"
    die "apt-get $1 failed: ${why:-see the output of apt-get}" \
        "$( [ "$(date +%s)" -ge "$deadline" ] && echo "(waited ${WAIT}s for the apt lock)")"
  done
}

say "installing slurm-wlm and munge (missing: ${missing[*]})"
apt update -qq
apt install -y -qq slurm-wlm munge
for p in "${PROGRAMS[@]}"; do
  command -v "$p" >/dev/null || [ -x "/usr/sbin/$p" ] || die "$p is still missing after the install"
done
say "ready: $(/usr/sbin/slurmd -V), $(/usr/sbin/munged -V | head -n1)"
