#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: real sshd on loopback, real checkpoints.
# The tests run on the project's venv (.venv, or $DFLASH_VENV), and so do the loopback hosts:
# their inventories name sys.executable, the venv's python.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec "${DFLASH_VENV:-.venv}/bin/python" -m pytest -q "$@"
