#!/usr/bin/env bash
# Set up what the tests need (if needed) and run the whole test suite: real sshd on
# loopback, real checkpoints, Chromium for the HTML report. The tests run on the project's
# venv (.venv, or $DFLASH_VENV), and so do the loopback hosts: their inventories name
# sys.executable, the venv's python. Two workers take a test file at a time, the slowest
# files first (tests/conftest.py), and the slowest tests are named at the end. Arguments
# go to pytest (e.g. tests/test_relay.py -k x; -n 0 runs in one process).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --for tests
exec "${DFLASH_VENV:-.venv}/bin/python" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations 15 "$@"
