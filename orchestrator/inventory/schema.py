"""The inventory's key tables: what each key takes, checked as the contract checks it."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import DflashError
from orchestrator.inventory.spec import EvalRole, TrainerRole
from orchestrator.sizes import parse_size
from remote.protocol import (
    COUNT,
    DTYPES,
    FLAG,
    TEXT,
    Check,
    EvalSpec,
    GroundTruthSpec,
    JobSpec,
    Sampling,
    is_int,
    is_number,
    one_of,
)

# The contract's checks for what a job carries, so a value accepted here is one the host
# accepts; the inventory's own for the rest.
_POSITIVE = Check("a positive number", lambda v: is_number(v) and v > 0)
_PORT = Check("a port number (1-65535)", lambda v: is_int(v) and 1 <= v <= 65535)


def _is_size(v: Any) -> bool:
    if isinstance(v, str):
        try:
            parse_size(v)
        except DflashError:
            return False
        return True
    return is_int(v) and v >= 0


_SIZE = Check("a size in bytes or like 500M, 10G, 1.5TiB", _is_size)
_GT = GroundTruthSpec.CHECKS

HOST_KEYS: dict[str, Check] = {
    "transport": one_of("ssh", "local"),
    "hostname": TEXT,
    "user": TEXT,
    "port": _PORT,
    "jump": TEXT,
    "python": TEXT,
    "workdir": TEXT,
    "identity_file": TEXT,
    "known_hosts": TEXT,
    "accept_new_host_key": FLAG,
    "connect_timeout": _POSITIVE,
}
ROLE_KEYS: dict[str, tuple[type, dict[str, Check], tuple[str, ...]]] = {
    "trainer": (
        TrainerRole,
        {
            "checkpoints": TEXT,
            "complete_rule": one_of("auto", "marker", "stable"),
            "marker": TEXT,
            "stable_seconds": _POSITIVE,
        },
        ("checkpoints",),
    ),
    "eval": (
        EvalRole,
        {
            "drafters": TEXT,
            "target_model": TEXT,
            "ground_truth": TEXT,
            "ground_truth_kind": _GT["kind"],
            "prompts": TEXT,
            "threads": COUNT,
            "dtype": one_of(*DTYPES),
            "ground_truth_model": _GT["model"],
            "max_new_tokens": Sampling.CHECKS["max_new_tokens"],
            "ground_truth_concurrency": _GT["concurrency"],
            "ground_truth_timeout": _GT["timeout"],
            "ground_truth_deadline": _GT["deadline"],
            "ground_truth_phase_deadline": _GT["phase_deadline"],
            "samples": JobSpec.CHECKS["samples"],
            **{k: EvalSpec.SAMPLING[k] for k in ("temperature", "top_k", "top_p", "draft_policy")},
            "gt_samples": Sampling.CHECKS["completions"],
            "reserve": _SIZE,
            **{name: JobSpec.CHECKS[name] for name in JobSpec.ROLE_SETTINGS},
        },
        ("drafters",),
    ),
}
DEFAULT_KEYS: dict[str, Check] = {
    "relay_from": TEXT,
    "relay_to": TEXT,
    "eval_host": TEXT,
    "keep": COUNT,
    "results_dir": TEXT,
}
HOST_REFERENCES = ("relay_from", "relay_to", "eval_host")
