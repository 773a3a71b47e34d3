"""What the command modules share: options, the inventory with the root options, and how a
command stops on Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.commands import output
from orchestrator.errors import DflashError
from orchestrator.eval.prompt_sets import builtin_set_names
from orchestrator.inventory import Inventory, load_inventory
from remote.protocol import (
    DEFAULT_BUDGETS,
    DEFAULT_SERVER_KIND,
    GT_DEFAULT_DEADLINE,
    GT_DEFAULT_PHASE_DEADLINE,
    GT_DEFAULT_TIMEOUT,
    GT_KINDS,
    POSITIONS,
    SpecError,
    kind_for,
    parse_budgets,
    parse_dtype,
)
from remote.protocol import GT_DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS
from remote.protocol.ladder import parse_rungs

InventoryOption = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        help="Inventory file (default: $DFLASH_INVENTORY, then ./inventory.yaml; a clone "
        "ships inventory.example.yaml to copy there).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def positive(value: float | None) -> float | None:
    """Option callback: a number that must be above 0 (Typer's `min` cannot exclude 0)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be more than 0, got {value:g}")
    return value


def _dtype(value: str | None) -> str | None:
    """bf16/fp32 become the one vocabulary of `remote.protocol`; an unknown dtype is a
    DflashError, so the CLI prints it as one line before anything connects."""
    try:
        return parse_dtype(value)
    except SpecError as exc:
        raise DflashError(str(exc)) from None


def _budgets(text: str | None) -> list[int] | None:
    """``8,16,32`` as budgets, checked before anything connects; empty: the default."""
    if not text:
        return None
    try:
        return list(parse_budgets(text, allow_empty=False))
    except SpecError as exc:
        raise DflashError(f"--{exc}") from None


def _positions(value: str | None) -> str | None:
    if value is not None and value not in POSITIONS:
        raise DflashError(f"--positions must be 'all' or 'walk', got {value!r}")
    return value


def _ladder(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return parse_rungs(value)
    except SpecError as exc:
        raise DflashError(f"--context-ladder: {exc}") from None


# ---- the options of an evaluation, shared by remote-eval, follow and parity --------------
# Engine settings (dtype, threads, budgets, topk, positions, device) become ONE EvalSpec
# (`orchestrator.eval.spec.engine_spec`); None: not given (the inventory's, else the
# protocol's default).

DtypeOption = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        callback=_dtype,
        help="bfloat16 (or bf16) | float32 (or fp32) (default: the inventory's).",
    ),
]
BudgetsOption = Annotated[
    str | None,
    typer.Option(
        "--budgets",
        callback=_budgets,
        help="DDTree node budgets, comma-separated "
        f"(default {','.join(map(str, DEFAULT_BUDGETS))}).",
    ),
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="CPU threads per host (default: the inventory's, else the host's choice: one "
        "for a target under 64 MiB, torch's own count otherwise; the run says which).",
    ),
]
TopkOption = Annotated[
    int | None, typer.Option(min=1, help="DDTree per-depth candidates (default: the budget).")
]
PositionsOption = Annotated[
    str | None,
    typer.Option(
        callback=_positions,
        help="Draft blocks only where the walks start rounds, the samples in lockstep "
        "('walk', the default; per-position acceptance over the chain walk's round "
        "starts), or at 'all' completion positions too (per-position acceptance over "
        "every one; the same rounds, more drafting).",
    ),
]
DeviceOption = Annotated[
    str | None,
    typer.Option(help="Where the engine computes on the host: cpu (default), cuda or cuda:N."),
]
PromptsOption = Annotated[
    str | None,
    typer.Option(
        help=f"Built-in set ({', '.join(builtin_set_names())}; docs/eval.md), a local JSONL "
        "file, or host:/path on the (comparing) eval host (default: the inventory's)."
    ),
]
SamplesOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Evaluate this many prompts (seeded choice; default: the inventory's, else "
        "every prompt of the set; 8 is a quick first look).",
    ),
]
SeedOption = Annotated[
    int, typer.Option(help="Seed of the prompt choice (and, above temperature 0, of sampling).")
]
TemperatureOption = Annotated[
    float | None,
    typer.Option(
        help="Temperature the ground truth is sampled at and tau is computed for (default: "
        "the inventory's, else 0: greedy; above 0: speculative-sampling acceptance in "
        "expectation, docs/dflash-eval.md)."
    ),
]
TopKOption = Annotated[
    int | None,
    typer.Option(
        "--top-k",
        help="Top-k of sampling (above temperature 0; default: the inventory's, else off).",
    ),
]
TopPOption = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        help="Top-p of sampling (above temperature 0; default: the inventory's, else off).",
    ),
]
DraftPolicyOption = Annotated[
    str | None,
    typer.Option(
        "--draft-policy",
        help="How the engine proposes drafts above temperature 0: 'argmax' (vLLM's default, "
        "draft_sample_method greedy) or 'sample' (vLLM's probabilistic: drafts sampled at "
        "the temperature alone); default: the inventory's, else argmax.",
    ),
]
GtSamplesOption = Annotated[
    int | None,
    typer.Option(
        "--gt-samples",
        help="Sampled ground-truth completions per prompt (above temperature 0; default: the "
        "inventory's, else 1).",
    ),
]
ContextLadderOption = Annotated[
    str | None,
    typer.Option(
        "--context-ladder",
        callback=_ladder,
        help="Put each chosen prompt at these context lengths (e.g. 1k,2k,4k,8k; k = 1024 "
        "tokens) after a history of the set's other questions with the target's answers, "
        "for tau by context (docs/eval.md).",
        show_default=False,
    ),
]
MaxNewTokensOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Ground-truth completion length (default: the inventory's, else "
        f"{DEFAULT_MAX_NEW_TOKENS}).",
    ),
]
GroundTruthOption = Annotated[
    str | None,
    typer.Option(
        help="Ground-truth server URL (as seen from the eval host), or a file there for "
        "kind 'file' (default: the inventory's; none: the target makes it on the host)."
    ),
]
GroundTruthKindOption = Annotated[
    str | None,
    typer.Option(
        help=" | ".join(GT_KINDS) + f" (default: the inventory's; else {DEFAULT_SERVER_KIND} "
        f"for a --ground-truth URL, {kind_for({}).name} without one: the target makes it on "
        "the eval host, said in a note).",
    ),
]
# The bounds on waiting for ground truth (`remote.protocol.GTLimits`), checked there: a bad
# value is one line before anything connects. None: the inventory's, else the default.
GtTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--gt-timeout",
        help="Seconds a ground-truth server may stay silent on one read (default: the "
        f"inventory's ground_truth_timeout, else {GT_DEFAULT_TIMEOUT:g}).",
        show_default=False,
    ),
]
GtDeadlineOption = Annotated[
    float | None,
    typer.Option(
        "--gt-deadline",
        help="Seconds one ground-truth request may take in all, however the server trickles "
        f"(default: the inventory's ground_truth_deadline, else {GT_DEFAULT_DEADLINE:g}).",
        show_default=False,
    ),
]
GtPhaseDeadlineOption = Annotated[
    float | None,
    typer.Option(
        "--gt-phase-deadline",
        help="Seconds the whole ground-truth phase may take (default: the inventory's "
        f"ground_truth_phase_deadline, else {GT_DEFAULT_PHASE_DEADLINE:g}).",
        show_default=False,
    ),
]
FreshGroundTruthOption = Annotated[
    bool,
    typer.Option(
        "--fresh-ground-truth",
        help="Make the ground truth again instead of reusing the eval host's cached entry "
        "(which the new one replaces).",
    ),
]
FeatureCacheOption = Annotated[
    bool,
    typer.Option(
        "--feature-cache/--no-feature-cache",
        help="Reuse the target's features (and greedy tokens) an earlier eval on this host "
        "kept for the same target, ground truth and settings, and keep this eval's "
        "(bounded by roles.eval.feature_cache_gib); --no-feature-cache computes them "
        "afresh and keeps nothing.",
    ),
]
ResultsDirOption = Annotated[
    str | None,
    typer.Option("--results-dir", help="Local results folder (default: defaults.results_dir)."),
]


def inventory(ctx: typer.Context, path: Path | None) -> Inventory:
    """The inventory, with the root option ``--accept-new-host-keys`` (kept in the root
    context's ``obj`` by `orchestrator.cli`) passed down to it."""
    obj = ctx.find_root().obj or {}
    return load_inventory(path, accept_new_host_keys=bool(obj.get("accept_new_host_keys")))


# How a stopped command exits, as a shell reports a command killed by the signal: 128 + 2
# (SIGINT, Ctrl-C), 128 + 15 (SIGTERM).
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so the library ends its streams, masters and jobs."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (a KeyboardInterrupt): a polite stop (kill,
    systemd) ends the work the same way as Ctrl-C, instead of killing it mid-write."""

    def handler(signum, frame):
        raise Terminated()

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (embedded use): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def stopped_by_signal(note: str = "") -> Iterator[None]:
    """`sigterm_as_interrupt`, and Ctrl-C or SIGTERM end the command with one yellow line
    (``interrupted`` or ``terminated``, then what the library said it could not finish on
    the way out, then `note`: what was kept, how to resume) and exit `EXIT_INTERRUPTED` or
    `EXIT_TERMINATED`, instead of click swallowing it silently."""
    with sigterm_as_interrupt():
        try:
            yield
        except KeyboardInterrupt as exc:
            term = isinstance(exc, Terminated)
            word = "terminated" if term else "interrupted"
            code = EXIT_TERMINATED if term else EXIT_INTERRUPTED
            # what the way out could not finish (a Slurm array left to cancel by hand)
            left = f": {output.plain(str(exc))}" if str(exc) else ""
            output.exit_with(code, f"[yellow]{word}[/]{left}{note}")
