"""Moved: the ground-truth server lives in `orchestrator.demo.gtserver` (the demo uses it)."""

from orchestrator.demo.gtserver import Greedy, GroundTruthServer  # noqa: F401
