#!/usr/bin/env bash
# Set up what the demo needs (if needed) and run the built-in local demo: relay, probe and
# evaluate on one machine. It runs from the project's venv (.venv, or $DFLASH_VENV) that
# setup.sh made, without activating it: the demo's local hosts run that venv's python too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --for demo
exec "${DFLASH_VENV:-.venv}/bin/dflash" demo "$@"
