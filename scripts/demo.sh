#!/usr/bin/env bash
# Set up (if needed) and run the built-in local demo: relay, probe and evaluate on one machine.
# Everything runs from the project's venv (.venv, or $DFLASH_VENV) that setup.sh made.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec "${DFLASH_VENV:-.venv}/bin/dflash" demo "$@"
