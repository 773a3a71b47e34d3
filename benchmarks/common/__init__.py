"""What the benchmarks share, so each script is only its question:

- `measure`: interleaved rounds timed on the wall and CPU clocks, medians and bests, load
  averages, goal lines, a child's peak RSS;
- `models`: random-weight targets and drafters (dense, MoE VLM), random samples;
- `pair`: the trained 27B-shaped pair (a target at Qwen3.6-27B's shape ratios, a 5-layer
  drafter trained on it), cached;
- `baseline`: an earlier revision checked out as a git worktree, measured in the same run;
- `hosts`: loopback sshd hosts and their inventories; `relay`: the relay benchmarks' two.

Importing it puts this checkout first on ``sys.path``, so a benchmark measures this tree's
``orchestrator`` and ``remote``, not an installed copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
