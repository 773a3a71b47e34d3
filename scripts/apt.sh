#!/usr/bin/env bash
# apt-get for scripts/setup.sh: `apt.sh update` or `apt.sh install PACKAGE...`.
#
# Waits for another apt or dpkg that holds the dpkg lock (unattended upgrades, a second
# set-up) up to $DFLASH_APT_LOCK_TIMEOUT seconds (default 300), instead of failing at once.
# apt's own output goes to a log file; a failure is ONE line on stderr saying what failed,
# apt's reason, what to do, and where the log is. Runs apt-get through sudo when not root.
set -euo pipefail

LOCK_TIMEOUT=${DFLASH_APT_LOCK_TIMEOUT:-300}

die() { echo "setup: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: apt.sh update | apt.sh install PACKAGE..."
action=$1
shift
what="apt-get $action${*:+ $*}"

command -v apt-get >/dev/null \
  || die "no apt-get here to install ${*:-packages}: install ${*:-them} with your package manager, then run set-up again"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "$what needs root: run set-up as root, or install sudo"
  SUDO=(sudo)
fi

log=$(mktemp "${TMPDIR:-/tmp}/dflash-apt.XXXXXX")
if DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get -q -y \
    -o "DPkg::Lock::Timeout=$LOCK_TIMEOUT" "$action" "$@" >"$log" 2>&1; then
  rm -f "$log"
  exit 0
fi
# apt's reason: its last error line (E: ...), else its last line.
reason=$(grep -E '^(E|Err):' "$log" | tail -n 1 || true)
[ -n "$reason" ] || reason=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 || true)
if grep -q 'Could not get lock' "$log"; then
  # apt names the lock and its holder while it waits: "Could not get lock L. It is held by
  # process N (NAME)".
  lock=$(grep -o 'Could not get lock [^ ]*' "$log" | tail -n 1 | sed 's/^Could not get lock //; s/\.$//')
  holder=$(grep -o 'held by process [0-9]* ([^)]*)' "$log" | tail -n 1 || true)
  die "$what: another apt or dpkg held the lock ${lock:-of dpkg} for over ${LOCK_TIMEOUT}s" \
      "(${holder:-$reason}); let it finish, or raise DFLASH_APT_LOCK_TIMEOUT, then run" \
      "set-up again (log: $log)"
fi
if [ "$action" = install ]; then
  todo="install $* yourself"
else
  todo="fix the package sources it names"
fi
die "$what failed: $reason; $todo, then run set-up again (log: $log)"
