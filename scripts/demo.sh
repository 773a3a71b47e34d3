#!/usr/bin/env bash
# Set up what the demo needs (if needed) and run the built-in local demo: relay, probe and
# evaluate on one machine. It runs from the project's venv (.venv, or $DFLASH_VENV) that
# setup.sh made, without activating it: the demo's local hosts run that venv's python too.
# The set-up's lines go to stderr, so stdout is the demo's alone (`--json` parses); how long
# the set-up took is handed to the demo, which prints it with its own times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=$SECONDS
bash scripts/setup.sh --for demo >&2
exec "${DFLASH_VENV:-.venv}/bin/dflash" demo --setup-seconds "$((SECONDS - started))" "$@"
