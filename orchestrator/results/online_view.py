"""An online measurement's verdict in a run folder (``verdict.json`` beside an eval's
files, `dflash online`): read and checked (`remote.online.verdict_doc`), and boiled down to
the numbers people read (`summary`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.results import speedup
from orchestrator.results.store import BadRun
from remote.online.verdict_doc import check_verdict_bytes
from remote.protocol import ResultError

VERDICT_FILE = "verdict.json"


def load_verdict(run_dir: str | Path) -> dict | None:
    """The run's verdict, checked; None when the run has none (an eval run). A damaged
    one is a `BadRun` naming the run and the field."""
    path = Path(run_dir) / VERDICT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadRun(f"run {path.parent.name}: cannot read {VERDICT_FILE}: {exc}") from None
    try:
        return check_verdict_bytes(data)
    except ResultError as exc:
        raise BadRun(f"run {path.parent.name}: {exc}; the file is damaged") from None


def summary(v: dict) -> dict[str, Any]:
    """The verdict's headline numbers, flat."""
    server = v.get("server") or {}
    on = v.get("online") or {}
    return {
        "verdict": v["verdict"],
        "detail": v["diagnosis"][0]["detail"],
        "engine": server.get("engine"),
        "server": server.get("url"),
        "started_here": server.get("started_here"),
        "samples": v["samples"],
        "block_size": v["block_size"],
        "num_speculative_tokens": v.get("num_spec_tokens"),
        "offline_tau": v["offline"].get("tau_token_weighted"),
        "online_tau": on.get("tau_token_weighted"),
        "online_uncut_tau": v.get("online_uncut_tau"),
        "rounds_equal": (v.get("rounds_equal") or {}).get("samples"),
        "lossless": v["lossless"]["samples"],
        "server_start_s": server.get("startup_s"),
        "measure_s": server.get("seconds"),
    }


ENGINE_SPEEDUP_UNMEASURED = (
    "not measured: the formula needs the engine's plain decode step, which only the engine "
    "serving the target without the drafter gives"
)


def speed(v: dict, run: Any) -> dict[str, Any]:
    """The serving engine's own times (the verdict's ``engine_costs``: its decode seconds
    per output token and per verify step, from its /metrics) beside the eval host's round
    costs and the speedup estimate they give (`speedup`): the same per-token figure from
    both, and why the engine's own estimate is not there."""
    c = speedup.costs(run)
    block = (run.result.get("inputs") or {}).get("block_size")
    step, draft = c.get("target_step_s"), c.get("drafter_round_s")
    verify = (c.get("target_verify_s") or {}).get(str(block))
    tau = run.metrics.get("tau_token_weighted")
    round_s = verify + draft if verify is not None and draft is not None else None
    return {
        "engine": v.get("engine_costs"),
        "engine_speedup_estimate": None,
        "engine_speedup_note": ENGINE_SPEEDUP_UNMEASURED,
        "offline": {
            "speedup_estimate": speedup.estimate(run).get("chain"),
            "formula": speedup.FORMULA,
            "target_step_s": step,
            "round_s": round_s,
            "time_per_output_token_s": round_s / tau if round_s and tau else None,
        },
    }


def position_rows(v: dict) -> list[tuple[int, dict, dict | None]]:
    """(position, offline counts, online counts or None) per draft position."""
    pp = v.get("per_position") or {}
    online = {p["position"]: p for p in (pp.get("online") or [])}
    return [(p["position"], p, online.get(p["position"])) for p in (pp.get("offline") or [])]
