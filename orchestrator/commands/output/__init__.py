"""Everything the CLI shows: consoles and ``--json`` (`base`), live views, one renderer module
per kind of result, tables as `tables.Grid` (rules: ARCHITECTURE.md). Names resolve lazily
(PEP 562), so a command imports only the renderers it uses and their libraries."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "LiveProgress": "progress",
    "OnlineProgress": "online",
    "ParityLines": "progress",
    "RelayProgress": "relaybar",
    "RichEvents": "events",
    "ShardProgress": "progress",
    "SlurmShardProgress": "slurm",
    "attached_json": "jobs",
    "check_json": "hosts",
    "check_table": "hosts",
    "console": "base",
    "emit": "base",
    "err_console": "base",
    "error_line": "base",
    "eval_bars": "progress",
    "eval_run_json": "results",
    "exit_with": "base",
    "flag": "base",
    "fmt": "base",
    "follow_json": "history",
    "gate_exit": "listing",
    "found_json": "results",
    "history_table": "history",
    "job_started": "progress",
    "mark": "base",
    "notes": "base",
    "num": "base",
    "online_json": "online",
    "parity_attach_json": "parity",
    "parity_json": "parity",
    "pct": "base",
    "plain": "base",
    "print_json": "base",
    "pruned_json": "jobs",
    "probe_tree": "hosts",
    "relay_bar": "live",
    "render_attached": "jobs",
    "render_cancelled": "jobs",
    "render_check": "hosts",
    "render_checkpoints": "relay",
    "render_comparison": "listing",
    "render_demo": "history",
    "render_env": "hosts",
    "render_eval_run": "results",
    "render_export": "listing",
    "render_follow": "history",
    "render_found": "results",
    "render_hosts": "hosts",
    "render_jobs": "jobs",
    "render_listing": "listing",
    "render_online_run": "online",
    "render_verdict": "online",
    "render_parity": "parity",
    "render_parity_run": "parity",
    "render_paths": "listing",
    "render_probe": "hosts",
    "render_pruned": "jobs",
    "render_relay_report": "relay",
    "render_report": "listing",
    "render_skipped": "listing",
    "render_run": "results",
    "render_started": "jobs",
    "render_summary": "results",
    "render_sweep": "sweep",
    "sweep_table": "sweep",
    "show": "base",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = sorted(_WHERE)
