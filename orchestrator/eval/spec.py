"""What to evaluate and how: the caller's options, and the job spec built from them.

`EvalOptions` is everything about one evaluation that is not the host or the checkpoint.
Its engine settings are ONE typed `remote.protocol.EvalSpec` (`engine`: dtype, threads,
DDTree budgets, topk, positions, device), validated when it is built, so a bad value is
refused before anything connects. `build_spec` turns the options into the job document
(``dflash.job/1``) for one host: the host's inventory role fills what the caller did not
choose, and the EvalSpec travels in it, serialised by its own `to_json`, under ``eval``.
Nothing here restates a spec field: the EvalSpec passes through whole.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval.prompt_sets import check_prompts
from orchestrator.eval.uploads import resolve_prompts, workdir_for
from orchestrator.inventory import EvalRole, HostSpec
from orchestrator.transport.hosts import Host
from remote.protocol import (
    GT_DEFAULT_CONCURRENCY,
    GT_DEFAULT_MAX_NEW_TOKENS,
    GT_SOURCES,
    JOB_CARRY_KEY,
    JOB_ENGINE_DEFAULT,
    JOB_EVAL_KEY,
    JOB_SPEC_SCHEMA,
    EvalSpec,
    GroundTruthSpec,
    GTKind,
    GTLimits,
    JobKind,
    JobSpec,
    Sampling,
    SpecError,
)
from remote.protocol.ladder import RUNGS


def engine_spec(**given: object) -> tuple[EvalSpec, frozenset[str]]:
    """The engine settings a caller gave (None: not given) over the job defaults, and the
    names of those given; a bad value is one line (`DflashError`), before anything
    connects. What is not given comes from the host's inventory role, else the defaults."""
    chosen = {k: v for k, v in given.items() if v is not None}
    try:
        return replace(JOB_ENGINE_DEFAULT, **chosen), frozenset(chosen)
    except SpecError as exc:
        raise DflashError(str(exc)) from None
    except TypeError as exc:  # a name EvalSpec does not have: a caller's bug, said plainly
        raise DflashError(f"not an engine setting: {exc}") from None


@dataclass
class EvalOptions:
    """Everything about one evaluation that is not the host or the checkpoint.

    `prompts`: a built-in set name (`orchestrator.eval.prompt_sets`), a local JSONL file (pushed
    with the job) or ``host:/path`` for a file already on the host; None = the inventory's
    ``prompts`` (a path on the host) or the built-in ``chat`` set. `ground_truth` is a server
    URL or (kind ``file``) a path on the host; None = the inventory's.

    ``ground_truth_timeout``/``_deadline``/``_phase_deadline``: the bounds on waiting for
    it (`remote.protocol.GTLimits`; None = the inventory's, else the defaults);
    `fresh_ground_truth`: make it again instead of reusing the host's cached entry.
    `feature_cache`: reuse and keep the target's features in the host's cache (bounded by
    the role's ``feature_cache_gib``); False computes them afresh and keeps nothing.
    `context_ladder`: the context lengths (tokens) each chosen prompt is put at after a
    conversation history (`remote.protocol.ladder`; None: the prompts as they are).

    `engine`: the engine's settings (`engine_spec` builds it from command-line values);
    its paths are filled per host by `build_spec`. `chosen`: the names of the settings the
    caller chose; the host's inventory role (``dtype``, ``threads``) fills the others. None
    (the default): every setting that differs from the job defaults counts as chosen.
    """

    prompts: str | None = None
    samples: int | None = None
    seed: int = 0
    max_new_tokens: int | None = None
    thinking: bool = False
    temperature: float | None = None  # None: the inventory role's (else greedy)
    top_k: int | None = None
    top_p: float | None = None
    gt_samples: int | None = None
    ground_truth: str | None = None
    ground_truth_kind: str | None = None
    ground_truth_model: str | None = None
    ground_truth_timeout: float | None = None
    ground_truth_deadline: float | None = None
    ground_truth_phase_deadline: float | None = None
    ground_truth_concurrency: int | None = None
    fresh_ground_truth: bool = False
    feature_cache: bool = True
    context_ladder: tuple[int, ...] | None = None
    target: str | None = None
    stop_after: str | None = None
    engine: EvalSpec = JOB_ENGINE_DEFAULT
    chosen: frozenset[str] | None = None

    def __post_init__(self) -> None:
        """Refuse values no eval can run with, before anything connects, with the checks
        the host applies to the job (`OPTION_CHECKS`, named by their flags): a zero or
        negative count is never replaced by the inventory's value, and a non-greedy
        temperature, an unknown ground-truth kind, a bad bound or a missing local prompts
        file never reaches a host."""
        for name, (flag, check) in OPTION_CHECKS.items():
            value = getattr(self, name)
            if value is not None and not check(value):
                raise DflashError(check.message(flag, value))
        if not isinstance(self.engine, EvalSpec):
            raise DflashError("EvalOptions.engine must be an EvalSpec (see engine_spec)")
        try:
            sampling = self.sampling(GT_DEFAULT_MAX_NEW_TOKENS)
            if self.temperature is not None:
                self.check_policy(sampling)
            self.ground_truth_limits(None)
        except SpecError as exc:
            raise DflashError(str(exc)) from None
        if self.prompts is not None and not self.prompts.startswith("host:"):
            check_prompts(self.prompts)
        if self.context_ladder is not None:
            try:
                rungs = RUNGS.require("--context-ladder", list(self.context_ladder))
            except SpecError as exc:
                raise DflashError(str(exc)) from None
            self.context_ladder = tuple(rungs)

    def sampling(self, max_new_tokens: int, role: EvalRole | None = None) -> Sampling:
        """How the ground truth is decoded (the job's ``sampling``): each setting given
        here, else the inventory `role`'s (its top-k, top-p and K only above 0); `seed`
        seeds it too."""
        t = _given(self.temperature, role.temperature if role else 0.0)
        kept = role if role is not None and t > 0 else None
        knobs = {
            k: _given(getattr(self, k), getattr(kept, k, None)) for k in EvalRole.SAMPLING_KEYS[1:]
        }
        return Sampling(
            max_new_tokens=max_new_tokens,
            temperature=t,
            top_k=knobs["top_k"],
            top_p=knobs["top_p"],
            seed=self.seed if t > 0 else 0,
            completions=knobs["gt_samples"] or 1,
        )

    def check_policy(self, sampling: Sampling) -> None:
        if self.engine.draft_policy != EvalSpec.draft_policy and not sampling.sampled:
            raise SpecError("--draft-policy applies above temperature 0 only (0 is greedy)")

    def ground_truth_limits(self, role: EvalRole | None) -> GTLimits:
        """The bounds on waiting for ground truth on a host with inventory role `role`:
        those given here, else the role's, else the defaults (a bad one: `SpecError`)."""
        return GTLimits(
            **{
                name: _given(
                    getattr(self, f"ground_truth_{name}"),
                    getattr(role, f"ground_truth_{name}") if role else getattr(GTLimits, name),
                )
                for name in GTLimits.LABELS
            }
        )

    def engine_for(self, role: EvalRole | None) -> EvalSpec:
        """The engine settings on a host with inventory role `role`: the role's own
        settings (`EvalRole.ENGINE_KEYS`) where the caller chose none."""
        chosen = self.chosen
        if chosen is None:
            chosen = {
                f.name
                for f in fields(EvalSpec)
                if getattr(self.engine, f.name) != getattr(JOB_ENGINE_DEFAULT, f.name)
            }
        if role is None:
            return self.engine
        keys = [k for k in EvalRole.ENGINE_KEYS if k not in chosen]
        if not self.sampling(1, role).sampled:  # a draft policy is for sampling only
            keys = [k for k in keys if k != "draft_policy"]
        return replace(self.engine, **{k: getattr(role, k) for k in keys})


# The options the host checks again in the job (the same `Check`s), by the flag that sets
# each.
OPTION_CHECKS = {
    "samples": ("--samples", JobSpec.CHECKS["samples"]),
    "max_new_tokens": ("--max-new-tokens", Sampling.CHECKS["max_new_tokens"]),
    "ground_truth_kind": ("--ground-truth-kind", GroundTruthSpec.CHECKS["kind"]),
    "ground_truth_concurrency": ("--gt-concurrency", GroundTruthSpec.CHECKS["concurrency"]),
}


# ---- the job spec -----------------------------------------------------------------------


def new_job_id(checkpoint: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(checkpoint.rstrip("/")).name).strip("-.")
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{slug[:48] or 'eval'}-{secrets.token_hex(2)}"


def resolve_checkpoint(host: Host, spec: HostSpec, checkpoint: str) -> str:
    """A checkpoint name resolves under the host's ``drafters`` folder; paths stay as given."""
    if checkpoint.startswith(("/", "~")):
        return host.expand(checkpoint)
    if not spec.eval:
        raise DflashError(
            f"host {spec.name} has no eval role in the inventory; give the "
            "checkpoint as an absolute path or add roles.eval.drafters"
        )
    return f"{host.expand(spec.eval.drafters).rstrip('/')}/{checkpoint}"


def target_model(spec: HostSpec, options: EvalOptions, flag: str = "--target") -> str:
    """The target folder (as the inventory or the caller names it) on host `spec`."""
    target = options.target or (spec.eval.target_model if spec.eval else None)
    if not target:
        raise DflashError(
            f"no target model for host {spec.name}: set roles.eval.target_model "
            f"in the inventory or pass {flag}"
        )
    return target


def _given(value, default):
    """The option when it was given (even a falsy one: zero is refused, never replaced),
    else the inventory's default."""
    return default if value is None else value


def ground_truth_spec(host: Host, spec: HostSpec, options: EvalOptions) -> GroundTruthSpec:
    """Where the job's ground truth comes from (`remote.protocol.GroundTruthSpec`): kind,
    server URL or file (on the host), the served model, the bounds on waiting for it
    (`EvalOptions.ground_truth_limits`), concurrency, ``fresh`` when asked; each the
    option's, else the host's inventory role's, else the contract's default (no kind: a
    source given is a server's URL; nothing given, the target makes it on the host). A
    source the kind needs and nobody gave is one line."""
    role = spec.eval
    kind, source = _kind_and_source(spec, options)
    # a source alone is a server's URL; an unknown kind is refused below
    needs = getattr(GT_SOURCES.get(kind), "needs", "url") if kind else "url"
    named = {needs: host.expand(source) if needs == "path" else source} if source else {}
    try:
        gt = GroundTruthSpec(
            kind=kind,
            **(named if needs else {}),
            model=options.ground_truth_model or (role.ground_truth_model if role else None),
            limits=options.ground_truth_limits(role),
            concurrency=_given(
                options.ground_truth_concurrency,
                role.ground_truth_concurrency if role else GT_DEFAULT_CONCURRENCY,
            ),
            fresh=options.fresh_ground_truth,
        )
    except SpecError as exc:
        raise DflashError(str(exc)) from None
    problem = gt.missing_source()
    if problem:
        raise DflashError(problem)
    return gt


def _kind_and_source(spec: HostSpec, options: EvalOptions) -> tuple[str | None, str | None]:
    """The ground-truth kind and source the options, else the host's eval role, name."""
    role = spec.eval
    kind = options.ground_truth_kind or (role.ground_truth_kind if role else None)
    return kind, options.ground_truth or (role.ground_truth if role else None)


def ground_truth_note(spec: HostSpec, options: EvalOptions) -> str | None:
    """The line saying that the target makes the ground truth on host `spec` because
    nothing names another source (no kind chosen, no server), else None."""
    if _kind_and_source(spec, options) != (None, None):
        return None
    return (
        f"no ground truth configured for {spec.name}: its target makes it there "
        f"(ground_truth_kind {GTKind.LOCAL.name}, slow for a large target); set "
        "roles.eval.ground_truth_kind, or roles.eval.ground_truth to a server URL"
    )


def ground_truth_source(host: Host, spec: HostSpec, options: EvalOptions) -> dict:
    """The job's ``ground_truth`` entry: `ground_truth_spec` in its wire form."""
    return ground_truth_spec(host, spec, options).to_json()


def build_spec(
    host: Host,
    spec: HostSpec,
    checkpoint: str,
    options: EvalOptions,
    *,
    engine: EvalSpec | None = None,
    exact_file: str | None = None,
    carry: list | None = None,
) -> dict:
    """The job spec (``dflash.job/1``) for evaluating `checkpoint` on `host`: ground truth,
    prompt selection and sampling, and the engine's `EvalSpec` (target and drafter paths on
    the host filled in) under ``eval``. `engine`: the settings to use as they are (paths
    included) instead of `options.engine_for` the host's role (a parity capture's).
    `exact_file`: a ground-truth file on the host that IS the selection (a shard's slice,
    another host's ids): kind ``file``, every sample in it, no prompts. `carry`: small
    input files (the prompts) travel inside the job start, appended to that list and
    carried under ``carry`` (`carry_or_push`); only for a spec that `start_job` sends."""
    role = spec.eval
    max_new = role.max_new_tokens if role else GT_DEFAULT_MAX_NEW_TOKENS
    try:
        sampling = options.sampling(_given(options.max_new_tokens, max_new), role)
        options.check_policy(sampling)
    except SpecError as exc:
        raise DflashError(f"{spec.name}: {exc}") from None
    if exact_file is not None:
        file = GTKind.FILE.name
        options = replace(options, ground_truth=exact_file, ground_truth_kind=file, prompts=None)
    if engine is None:
        engine = replace(
            options.engine_for(role),
            target=host.expand(target_model(spec, options)),
            drafter=resolve_checkpoint(host, spec, checkpoint),
        )
    job = {
        "schema": JOB_SPEC_SCHEMA,
        "kind": JobKind.EVAL,
        "created": time.time(),
        "host": spec.name,
        "checkpoint": Path(checkpoint.rstrip("/")).name,
        # an exact file is the selection: never re-selected from
        "samples": None
        if exact_file is not None
        else _given(options.samples, (role.samples if role else None)),
        "seed": options.seed,
        "thinking": options.thinking,
        "sampling": sampling.to_json(),
        "ground_truth": ground_truth_source(host, spec, options),
        JOB_EVAL_KEY: engine.to_json(),
        "stop_after": options.stop_after,
        "feature_cache": options.feature_cache,
        # the job settings the host's eval role sets (the contract's defaults without one)
        **{k: getattr(role, k) if role else d for k, d in JobSpec.ROLE_SETTINGS.items()},
        # the ladder makes the prompts its ground truth is made for: an exact file has them
        "context_ladder": list(options.context_ladder)
        if options.context_ladder and exact_file is None
        else None,
        "workdir": workdir_for(host, carry),  # the host records its own, expanded
    }
    if GT_SOURCES[job["ground_truth"]["kind"]].reads_prompts:
        job["prompts"] = resolve_prompts(host, spec, options.prompts, carry)
    if carry:
        job[JOB_CARRY_KEY] = carry
    return job


# What a job's settings change in its result, and what they do not: the time and place it
# ran, and how fast it went.
ENGINE_SPEED_KEYS = ("threads", "block_chunk", "output_dir", "ground_truth")
GT_SPEED_KEYS = ("timeout", "concurrency")


def eval_identity(job: dict) -> dict:
    """What makes two eval job specs (``dflash.job/1``, as `build_spec` makes them or as a
    run folder's ``spec.json`` keeps them) the same evaluation: host, checkpoint and its
    path there, target, prompts (by content where known), selection, sampling, ground-truth
    source and engine settings. Not when, under which id or in which workdir it ran, nor
    what only sets its speed (threads, batching, ground-truth concurrency and timeout) or
    is filled in on the host."""

    def part(key: str) -> dict:  # a pulled spec.json is a host's word: any JSON
        value = job.get(key)
        return value if isinstance(value, dict) else {}

    engine = {k: v for k, v in part(JOB_EVAL_KEY).items() if k not in ENGINE_SPEED_KEYS}
    prompts = part("prompts")
    gt = {k: v for k, v in part("ground_truth").items() if k not in GT_SPEED_KEYS}
    return {
        "kind": job.get("kind", JobKind.EVAL),
        "host": job.get("host"),
        "checkpoint": job.get("checkpoint"),
        "samples": job.get("samples"),
        "seed": job.get("seed"),
        "thinking": bool(job.get("thinking")),
        "sampling": job.get("sampling"),
        "ground_truth": gt,
        "prompts": prompts.get("sha256") or prompts.get("path"),
        "stop_after": job.get("stop_after"),
        "context_ladder": job.get("context_ladder"),
        JOB_EVAL_KEY: engine,
    }
