"""An online run's ``verdict.json``, read, checked and boiled down to the numbers people read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.results import speedup
from orchestrator.results.store import BadRun
from remote.online.verdict_doc import check_verdict_bytes
from remote.protocol import ResultError
from remote.protocol import metrics as registry

VERDICT_FILE = "verdict.json"
# Shown for both sides, the registry's headline first.
TAUS = ("tau_per_sample_mean", "tau_token_weighted")


def load_verdict(run_dir: str | Path) -> dict | None:
    """The run's verdict, checked (a `BadRun` if damaged); None for an eval run."""
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
    """The verdict's headline numbers, flat; `TAUS` as ``offline_<name>``, ``online_<name>``."""
    server = v.get("server") or {}
    on = v.get("online") or {}
    taus = {f"{side}_{m}": (v[side] or {}).get(m) for side in ("offline", "online") for m in TAUS}
    base = v.get("baseline") or {}
    return {
        "verdict": v["verdict"],
        "detail": v["diagnosis"][0]["detail"],
        "engine": server.get("engine"),
        "engine_version": server.get("version"),
        "platform": server.get("platform"),
        "threads": server.get("threads"),
        "threads_from": server.get("threads_from"),
        "max_model_len": server.get("max_model_len"),
        "server": server.get("url"),
        "started_here": server.get("started_here"),
        "samples": v["samples"],
        "block_size": v["block_size"],
        "num_speculative_tokens": v.get("num_spec_tokens"),
        "offline_tau": v["offline"].get("tau_token_weighted"),
        "online_tau": on.get("tau_token_weighted"),
        **taus,
        "online_uncut_tau": v.get("online_uncut_tau"),
        "rounds_equal": (v.get("rounds_equal") or {}).get("samples"),
        "lossless": v["lossless"]["samples"],
        "server_start_s": server.get("startup_s"),
        "measure_s": server.get("seconds"),
        "baseline_start_s": base.get("startup_s"),
        "speedup_measured": ((v.get("levels") or [{}])[0]).get("speedup"),
        "confirmed_deviations": [
            d["name"] for d in v.get("deviations") or [] if d["status"] == "confirmed"
        ],
    }


def tau_rows(v: dict) -> list[tuple[str, str, str]]:
    """(the registry's label, offline, online) for each of `TAUS`, as the registry prints."""
    rows = []
    for name in TAUS:
        m = registry.find(name)
        rows.append(
            (m.label, m.text(v["offline"].get(name)), m.text((v["online"] or {}).get(name)))
        )
    return rows


def level_rows(v: dict) -> list[dict[str, Any]]:
    """Each concurrency level's acceptance, rounds, losslessness and speed, baseline beside."""
    return [
        {
            "concurrency": lv["concurrency"],
            **{name: lv.get(name) for name in TAUS},
            "same_rounds_as_first": lv.get("same_rounds_as_first"),
            "lossless": lv.get("lossless"),
            "tokens_per_s": lv.get("tokens_per_s"),
            "baseline_tokens_per_s": lv.get("baseline_tokens_per_s"),
            "speedup": lv.get("speedup"),
        }
        for lv in v.get("levels") or []
    ]


ENGINE_SPEEDUP_UNMEASURED = (
    "not measured: the formula needs the engine's plain decode step, which only the engine "
    "serving the target without the drafter gives (dflash online --baseline)"
)


def speed(v: dict, run: Any) -> dict[str, Any]:
    """The serving engine's own times and measured speedup beside the eval host's round costs
    and estimate, the same per-token figure from both (docs/online.md)."""
    c = speedup.costs(run)
    block = (run.result.get("inputs") or {}).get("block_size")
    step, draft = c.get("target_step_s"), c.get("drafter_round_s")
    verify = (c.get("target_verify_s") or {}).get(str(block))
    tau = run.metrics.get("tau_token_weighted")
    round_s = verify + draft if verify is not None and draft is not None else None
    base = v.get("baseline") or {}
    first = (v.get("levels") or [{}])[0]
    return {
        "engine": v.get("engine_costs"),
        "engine_plain": base.get("engine_costs"),
        "engine_speedup_measured": first.get("speedup"),
        "engine_tokens_per_s": first.get("tokens_per_s"),
        "engine_plain_tokens_per_s": first.get("baseline_tokens_per_s"),
        "engine_speedup_estimate": base.get("decode_speedup"),
        "engine_speedup_note": None if base else ENGINE_SPEEDUP_UNMEASURED,
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
