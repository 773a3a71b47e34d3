#!/usr/bin/env bash
# Install what dflash, its demo and its tests need on a fresh Debian/Ubuntu machine.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-python3}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! [ -x /usr/sbin/sshd ] || ! command -v ssh-keygen >/dev/null || ! command -v scp >/dev/null; then
  echo "setup: installing OpenSSH (server for the tests' loopback hosts, client for scp -3)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssh-server openssh-client >/dev/null
fi

# Chromium: tests/test_results.py renders the HTML report in a real headless browser.
command -v chromium >/dev/null || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; }

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU)"
  "$PY" -m pip install -q torch==2.13.0
fi
# Always (re)install this checkout in editable mode: cheap when everything is there, and it
# makes `dflash` point at THIS checkout rather than another clone installed earlier.
echo "setup: installing dflash (this checkout) with its eval and test extras"
"$PY" -m pip install -q --disable-pip-version-check -e '.[dev]'
