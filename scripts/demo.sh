#!/usr/bin/env bash
# Set up (if needed) and run the built-in local demo: relay, probe and evaluate on one machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec dflash demo "$@"
