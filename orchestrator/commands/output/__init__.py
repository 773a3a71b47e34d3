"""Everything the CLI shows, in one package: the consoles and ``--json`` (`base`), the live
progress views the commands hand to the library (`progress`, opened only when shown by
`live`; follow's `events`; a Slurm eval's task lines, `slurm`), and one module of
renderers per kind of result (`hosts`, `relay`, `results`, `listing`, `history`, `online`,
`parity`, `jobs`), all drawing their tables as `tables.Grid` (ids and numbers never cut,
names never markup). A command makes its one library call and hands the result to `emit`
with its renderer; commands never print themselves and never import one another.

Names resolve lazily (PEP 562): ``output.emit`` imports `base` alone, so a command such as
``relay`` does not import the eval, probe and results renderers and their libraries to
start (a third of a second of an unchanged relay here)."""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
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
    "show": "base",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = sorted(_WHERE)
