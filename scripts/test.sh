#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: real sshd on loopback, real checkpoints.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
