"""Real vLLM on loopback (`orchestrator.demo.vllm`, shared with the benchmarks), and
`vllm_python`, which skips the calling test where this machine has no vLLM venv."""

from __future__ import annotations

from pathlib import Path

from orchestrator.demo import vllm as _vllm
from orchestrator.demo.vllm import RECIPE as RECIPE
from orchestrator.demo.vllm import VllmModels as VllmModels
from orchestrator.demo.vllm import VllmServer as VllmServer
from orchestrator.demo.vllm import vllm_models as vllm_models
from tests.helpers.required import unavailable


def vllm_python() -> Path:
    """The vLLM venv's python, or a skip saying how to make it (under CI, a failure:
    `unavailable`)."""
    try:
        return _vllm.vllm_python()
    except _vllm.VllmMissing as exc:
        unavailable(str(exc))
