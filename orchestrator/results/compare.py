"""Paired comparison of two runs over the same samples, with a bootstrap interval.

"Step 12000 beats step 8000" is a claim about the drafter, not about the prompts drawn:
both runs scored the very same samples (same prompts, same ground-truth completions, same
target, same dtype), so the per-sample differences ``tau_B - tau_A`` carry the signal and
the prompt-to-prompt spread cancels. `paired` reports their mean with a percentile
bootstrap 95% interval (samples resampled with replacement, seeded, so the same runs give
the same interval), and the share of samples that improved, got worse or tied.

`comparability` says what makes two runs NOT comparable, one line per reason; `paired`
then refuses to pair them (``comparable`` False, no delta), since a difference in tau
between different prompts or ground truths says nothing about the drafter. Above
temperature 0 the deltas are of the expected tau, and the interval resamples prompts with
their completions; ground truths sampled apart are compared by prompt (`PAIRINGS`,
docs/results.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.results import settings
from orchestrator.results import store as res
from orchestrator.results.bootstrap import CONFIDENCE as CONFIDENCE
from orchestrator.results.bootstrap import RESAMPLES as RESAMPLES
from orchestrator.results.bootstrap import bootstrap_interval as bootstrap_interval
from orchestrator.results.bootstrap import cluster_interval
from orchestrator.results.summary import budget_key, budget_label
from remote.protocol import metrics as registry
from remote.protocol.metrics import Metric


@dataclass
class Delta:
    """B minus A for one metric over the paired samples."""

    metric: str  # a metric's name in the registry
    budget: str | None  # its DDTree budget (None: the chain walk)
    label: str  # how a table names it (``tau``, ``DDTree-8 tau``)
    mean_a: float
    mean_b: float
    delta: float
    low: float  # bootstrap interval of the mean delta
    high: float
    improved: float | None  # share of samples where B > A (None: completions not shared)
    worse: float | None
    tied: float | None


@dataclass
class GroupDeltas:
    """The paired deltas of one group of samples (a category, a completion-length bucket:
    `breakdown.AXES`), over the pairs in it."""

    axis: str
    name: str
    samples: int
    deltas: list[Delta] = field(default_factory=list)


@dataclass
class Paired:
    """A paired comparison of run B against run A."""

    a: str
    b: str
    comparable: bool
    problems: list[str] = field(default_factory=list)
    samples: int = 0  # samples both runs scored
    only_a: int = 0
    only_b: int = 0
    deltas: list[Delta] = field(default_factory=list)
    groups: list[GroupDeltas] = field(default_factory=list)
    resamples: int = RESAMPLES
    confidence: float = CONFIDENCE
    seed: int = 0
    pairing: str = "samples"  # one of `PAIRINGS`

    def to_json(self) -> dict:
        return asdict(self)


def _target(run: res.Run) -> Any:
    inputs = run.result.get("inputs") or {}
    ident = inputs.get("target_identity")
    if isinstance(ident, dict) and ident.get("config_sha256"):
        return ("config", ident.get("config_sha256"), tuple(map(tuple, ident.get("weights") or [])))
    return (
        "shape",
        inputs.get("target_architecture"),
        inputs.get("target_layers"),
        inputs.get("target_vocab_size"),
        inputs.get("target"),
    )


def _prompts(run: res.Run) -> Any:
    p = run.spec.get("prompts") or (run.result.get("inputs") or {}).get("prompts") or {}
    return p.get("sha256") or p.get("path") or p.get("name")


def _ground_truth(run: res.Run) -> Any:
    inputs = run.result.get("inputs") or {}
    return inputs.get("ground_truth_sha256") or res.ground_truth_source(run).get("cache_key")


# How the prompts were put to the target: another thinking mode or chat template is
# another eval (z-lab/dflash#133: acceptance 25% -> 60% with thinking off), said first.
PROMPTING = (
    ("thinking mode", settings.thinking),
    ("chat template", settings.chat_template),
)
CHECKS = (
    ("sampling", settings.sampling),  # another temperature or draft policy: another tau
    ("prompts", _prompts),
    ("ground truth", _ground_truth),
    ("target", _target),
    ("dtype", settings.dtype),
)


# How two comparable runs pair: greedy samples; sampled completions both runs walked (the
# same ground truth: the completions' noise is shared and cancels); or prompts, when each
# run sampled its own completions (their noise stays in the interval, which widens).
PAIRINGS = {
    "samples": "paired by sample",
    "completions": "paired by sampled completion (one ground truth), prompts resampled",
    "prompts": "ground truths sampled apart (other seeds): unpaired completions, compared by "
    "prompt; the interval holds both runs' sampling noise",
}


def pairing(a: res.Run, b: res.Run) -> str:
    """`PAIRINGS`' key for `a` against `b` (both sampled alike, or not, as compared)."""
    if settings.sampling(a) == "greedy" or settings.sampling(b) == "greedy":
        return "samples"
    ga, gb = _ground_truth(a), _ground_truth(b)
    return "completions" if ga is not None and ga == gb else "prompts"


def _cluster(rec: dict) -> str:
    return str(rec.get("prompt_id") or rec.get("id"))


def _differences(a: res.Run, b: res.Run, checks: tuple) -> list[str]:
    problems = []
    for what, key in checks:
        ka, kb = key(a), key(b)
        if ka is not None and kb is not None and ka != kb:
            problems.append(f"different {what}: {_show(ka)} vs {_show(kb)}")
    return problems


def prompting_problems(a: res.Run, b: res.Run) -> list[str]:
    """How `a` and `b` put their prompts to the target differently (`PROMPTING`: thinking
    mode, chat template), one line each; [] when alike or not recorded."""
    return _differences(a, b, PROMPTING)


def comparability(
    a: res.Run,
    b: res.Run,
    recs_a: list[dict] | None = None,
    recs_b: list[dict] | None = None,
    *,
    allow_different_prompting: bool = False,
) -> list[str]:
    """Why `a` and `b` cannot be paired sample by sample; [] when they can. With
    `allow_different_prompting`, another thinking mode or chat template is no reason."""
    problems = [] if allow_different_prompting else prompting_problems(a, b)
    apart = pairing(a, b) == "prompts"
    problems += _differences(a, b, tuple(c for c in CHECKS if not apart or c[1] != _ground_truth))
    recs_a = res.records(a) if recs_a is None else recs_a
    recs_b = res.records(b) if recs_b is None else recs_b
    if not recs_a or not recs_b:
        missing = [r.run_id for r, recs in ((a, recs_a), (b, recs_b)) if not recs]
        problems.append(f"no per-sample records (samples.jsonl) in {', '.join(missing)}")
        return problems
    by_id = {str(r.get("id")): r for r in recs_a}
    shared = [(by_id[str(r.get("id"))], r) for r in recs_b if str(r.get("id")) in by_id]
    if not shared:
        problems.append("no sample ids in common")
    # The same id must be the same sample: equal prompt and completion lengths at least.
    length = "prompt_tokens" if apart else "completion_tokens"
    differ = [
        str(ra.get("id"))
        for ra, rb in shared
        if (ra.get("prompt_tokens"), ra.get(length)) != (rb.get("prompt_tokens"), rb.get(length))
    ]
    if differ:
        problems.append(
            f"different ground truth for {len(differ)} shared sample ids "
            f"(e.g. {differ[0]}): prompt or completion lengths differ"
        )
    relabelled = [str(ra.get("id")) for ra, rb in shared if _labels(ra) != _labels(rb)]
    if relabelled:
        problems.append(
            f"different categories for {len(relabelled)} shared sample ids "
            f"(e.g. {relabelled[0]}): another labelling of the prompts"
        )
    return problems


def _labels(rec: dict) -> tuple:
    return rec.get("category"), rec.get("subcategory")


def _show(v: Any) -> str:
    text = str(v[1] if isinstance(v, tuple) and len(v) > 1 and v[0] == "config" else v)
    digest = len(text) > 16 and all(c in "0123456789abcdef" for c in text)
    return text[:12] + "…" if digest else text  # a sha256 by its start; anything else whole


def paired_metrics() -> list[Metric]:
    """The metrics a comparison pairs: each mean of per-sample values (its paired delta is
    then the difference of the two runs' values); `deltas` adds each DDTree budget where
    the registry shows one (`Metric.budgets`)."""
    return [m for m in registry.scalars() if m.reduce == registry.MEAN]


def paired(
    a: res.Run,
    b: res.Run,
    resamples: int = RESAMPLES,
    seed: int = 0,
    *,
    allow_different_prompting: bool = False,
) -> Paired:
    """B against A over the samples both scored: tau and every DDTree budget both have,
    over all of them and within each group (`group_deltas`: categories, lengths; and
    `keyed_deltas`: each context bucket)."""
    recs_a, recs_b = res.records(a), res.records(b)
    out = Paired(a=a.run_id, b=b.run_id, comparable=False, resamples=resamples, seed=seed)
    out.problems = comparability(
        a, b, recs_a, recs_b, allow_different_prompting=allow_different_prompting
    )
    ids_a = {str(r.get("id")) for r in recs_a}
    ids_b = {str(r.get("id")) for r in recs_b}
    out.samples, out.only_a, out.only_b = len(ids_a & ids_b), len(ids_a - ids_b), len(ids_b - ids_a)
    if out.problems:
        return out
    out.comparable, out.pairing = True, pairing(a, b)
    by_id = {str(r.get("id")): r for r in recs_a}
    pairs = [(by_id[str(r.get("id"))], r) for r in recs_b if str(r.get("id")) in by_id]
    budgets = sorted(
        set.intersection(*[set(r.get("ddtree") or {}) for pair in pairs for r in pair]),
        key=budget_key,
    )
    out.deltas = deltas(pairs, budgets, resamples, seed, out.pairing)
    out.groups = group_deltas(pairs, budgets, resamples, seed, out.pairing)
    out.groups += keyed_deltas(pairs, resamples, seed, out.pairing)
    return out


def deltas(
    pairs: list[tuple[dict, dict]],
    budgets: list[str],
    resamples: int,
    seed: int,
    pairing: str = "samples",
) -> list[Delta]:
    """B minus A over `pairs` (records of A, records of B) for each paired metric
    (`paired_metrics`), and per DDTree budget both have, each with its bootstrap
    interval (`delta`); sampled, the chain walk's by its expectation alone."""
    out = []
    sampled = pairing != "samples"
    for m in paired_metrics():
        chain = [] if sampled and m.of == registry.WALK else [None]
        for budget in [*chain, *(budgets if m.budgets else [])]:
            vals = [
                (m.per_sample(ra, budget), m.per_sample(rb, budget), _cluster(ra))
                for ra, rb in pairs
            ]
            vals = [v for v in vals if v[0] is not None and v[1] is not None]
            if vals:
                out.append(delta(m, budget, vals, resamples, seed, pairing=pairing))
    return out


def delta(
    m: Metric | registry.Keyed,
    budget: str | None,
    vals: list[tuple],
    resamples: int,
    seed: int,
    label: str | None = None,
    pairing: str = "samples",
) -> Delta:
    """`vals`: (A's, B's[, cluster]) per pair; the interval resamples clusters (prompts)."""
    diffs = [v[1] - v[0] for v in vals]
    n = len(diffs)
    clusters = [v[2] if len(v) > 2 else str(i) for i, v in enumerate(vals)]
    lo, hi = cluster_interval(diffs, clusters, resamples, CONFIDENCE, seed)
    shared = pairing != "prompts"
    return Delta(
        metric=m.name,
        budget=budget,
        label=label or (m.header if budget is None else budget_label(m, budget)),
        mean_a=sum(v[0] for v in vals) / n,
        mean_b=sum(v[1] for v in vals) / n,
        delta=sum(diffs) / n,
        low=lo,
        high=hi,
        improved=sum(d > 0 for d in diffs) / n if shared else None,
        worse=sum(d < 0 for d in diffs) / n if shared else None,
        tied=sum(d == 0 for d in diffs) / n if shared else None,
    )


def headline(deltas: list[Delta], name: str = registry.HEADLINE) -> Delta | None:
    """The chain walk's delta of metric `name` (the headline's by default: above
    temperature 0, its expectation's)."""
    found = next((d for d in deltas if d.metric == name and d.budget is None), None)
    if found is None and name == registry.HEADLINE:
        return headline(deltas, registry.EXPECTED)
    return found


def headline_label(deltas_of) -> str:
    """The label of the first headline delta among `deltas_of` (lists of deltas): the
    expected tau's above temperature 0, where a column of those deltas must say so."""
    found = (headline(list(d)) for d in deltas_of)
    return next((d.label for d in found if d is not None), registry.headline().header)


def group_deltas(
    pairs: list[tuple[dict, dict]],
    budgets: list[str],
    resamples: int,
    seed: int,
    pairing: str = "samples",
) -> list[GroupDeltas]:
    """`deltas` within each group of the pairs (by A's record: the labels and lengths of
    a comparable pair are the same), axis by axis (`breakdown.groups`); completions sampled
    apart have no shared length, so no length groups."""
    from orchestrator.results import breakdown

    by_id = {id(ra): (ra, rb) for ra, rb in pairs}
    out = []
    for axis in breakdown.AXES:
        if pairing == "prompts" and axis == "completion_length":
            continue
        for name, recs in breakdown.groups([ra for ra, _ in pairs], axis):
            inside = [by_id[id(ra)] for ra in recs]
            found = deltas(inside, budgets, resamples, seed, pairing)
            out.append(GroupDeltas(axis, name, len(inside), found))
    return out


def keyed_deltas(
    pairs: list[tuple[dict, dict]], resamples: int, seed: int, pairing: str = "samples"
) -> list[GroupDeltas]:
    """Each per-key metric the registry pairs (`Keyed.paired`: tau by context), B minus A
    of each key's per-sample values (`Keyed.per_key`) over the pairs with one on both
    sides, as a group of the axis `Keyed.key_name` (``context``) named by its key."""
    out = []
    for m in registry.keyed():
        if not m.paired:
            continue
        per = [(m.per_key(ra), m.per_key(rb)) for ra, rb in pairs]
        for k in sorted({k for a, b in per for k in a.keys() & b.keys()}):
            vals = [
                (a[k], b[k], _cluster(ra))
                for (a, b), (ra, _) in zip(per, pairs, strict=True)
                if k in a and k in b
            ]
            found = delta(m, None, vals, resamples, seed, f"{m.header} {k}", pairing)
            out.append(GroupDeltas(m.key_name, str(k), len(vals), [found]))
    return out


def axes() -> list[tuple[str, str]]:
    """(axis, title) of every axis a comparison's groups fall on: the breakdown's
    (`breakdown.AXES`), then each paired per-key metric's (`keyed_deltas`)."""
    from orchestrator.results import breakdown

    out = [(axis, breakdown.TITLES[axis]) for axis in breakdown.AXES]
    return out + [(m.key_name, m.label) for m in registry.keyed() if m.paired]


def group_lead(g: GroupDeltas, name: str = registry.HEADLINE) -> Delta | None:
    """A group's delta of metric `name` (`headline`); a paired per-key group's own."""
    found = headline(g.deltas, name)
    keyed = {m.key_name for m in registry.keyed() if m.paired}
    return found or (g.deltas[0] if g.axis in keyed and g.deltas else None)
