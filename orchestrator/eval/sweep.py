"""A temperature sweep: one complete eval per temperature, each over its own ground truth
(sampled at that temperature, greedy at 0), then the sweep folder linking them
(`orchestrator.results.sweep`; docs/eval.md, "Sweeps")."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval.spec import EvalOptions, _kind_and_source
from orchestrator.inventory import HostSpec
from orchestrator.results import store as res
from orchestrator.results import sweep as view
from remote.protocol import EvalSpec, GTKind, SpecError
from remote.protocol.sampling import parse_temperatures


def temperatures(text: str | float | None) -> tuple[float, ...]:
    """`parse_temperatures` with its refusal as a `DflashError`."""
    try:
        return parse_temperatures(text)
    except SpecError as exc:
        raise DflashError(str(exc)) from None


def requested(text: str | float | None) -> tuple[tuple[float, ...], float | None]:
    """(the temperatures asked for, the one the options carry); none given: ((), None),
    so the eval role's temperature applies."""
    if text is None:
        return (), None
    temps = temperatures(text)
    return temps, first_sampled(temps)


def first_sampled(temps: Sequence[float]) -> float:
    """The temperature the sweep's shared options are checked at: the first above 0 (so
    --top-p and --draft-policy are taken), else 0."""
    return next((t for t in temps if t > 0), temps[0])


def at(options: EvalOptions, t: float) -> EvalOptions:
    """`options` at temperature `t`; at 0 what only sampling takes is dropped (greedy)."""
    if t > 0:
        return replace(options, temperature=t)
    engine = replace(options.engine, draft_policy=EvalSpec.draft_policy)
    return replace(options, temperature=0.0, top_k=None, top_p=None, gt_samples=None, engine=engine)


def check(options: EvalOptions, hosts: Sequence[HostSpec], detach: bool) -> None:
    """Refuse a sweep that cannot be one: detached, or over a ground-truth file (made at
    one temperature, so not the ground truth of the others)."""
    if detach:
        raise DflashError(
            "a temperature sweep runs its temperatures one after another: drop --detach, "
            "or start one detached eval per temperature"
        )
    for spec in hosts:
        kind, source = _kind_and_source(spec, options)
        is_path = kind is None and source and "://" not in source
        if kind == GTKind.FILE.name or is_path:
            raise DflashError(
                f"a temperature sweep samples its own ground truth at each temperature; "
                f"{spec.name}'s ground truth is a file (made at one temperature): give one "
                "--temperature, or a server or --ground-truth-kind local"
            )


def new_sweep_id(checkpoint: str) -> str:
    slug = Path(checkpoint.rstrip("/")).name[:48] or "eval"
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(2)}"


def run_sweep(
    run_one: Callable[[EvalOptions], Path],
    options: EvalOptions,
    temps: Sequence[float],
    checkpoint: str,
) -> view.Sweep:
    """`run_one` at each of `temps` in order (each a complete run folder), then the sweep
    folder beside them: the `Sweep`."""
    runs = [res.load_run(run_one(at(options, t))) for t in temps]
    return view.write_sweep(runs, runs[0].path.parent, new_sweep_id(checkpoint))
