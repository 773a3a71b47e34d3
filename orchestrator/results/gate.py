"""The CI gate of `dflash results compare BASE NEW`, paired (docs/results.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestrator.errors import DflashError
from orchestrator.results import compare as cmp
from remote.protocol import metrics as registry


@dataclass(frozen=True)
class GateOptions:
    """What fails NEW: `fail_below` or `fail_if_worse`, of `metric`, per group in `by`."""

    fail_below: float | None = None
    fail_if_worse: bool = False
    metric: str = registry.HEADLINE
    by: tuple[str, ...] = ()


def gate_request(
    fail_below: float | None, fail_if_worse: bool, metric: str | None, by: list[str] | None
) -> GateOptions | None:
    """The gate a command line asks for (None: no gate), checked before any run is read."""
    if fail_below is None and not fail_if_worse:
        if metric or by:
            raise DflashError("--gate-metric and --gate-by need --fail-below or --fail-if-worse")
        return None
    if fail_below is not None and not 0 < fail_below <= 10:
        raise DflashError(f"--fail-below {fail_below} is not a fraction of BASE; use e.g. 0.95")
    names = [m.name for m in cmp.paired_metrics()]
    if metric and metric not in names:
        raise DflashError(f"--gate-metric {metric!r} is not paired; use one of {', '.join(names)}")
    known = [axis for axis, _title in cmp.axes()]
    bad = [a for a in by or () if a not in known]
    if bad:
        raise DflashError(f"--gate-by {bad[0]!r} is unknown; use {', '.join(known)}")
    return GateOptions(fail_below, fail_if_worse, metric or registry.HEADLINE, tuple(by or ()))


@dataclass
class Check:
    """One comparison the gate made (all samples or a group), and why it failed."""

    run: str
    axis: str | None
    group: str | None
    samples: int
    base: float
    new: float
    ratio: float | None
    delta: float
    low: float
    high: float
    failed: list[str] = field(default_factory=list)

    def where(self, label: str) -> str:
        return label if self.axis is None else f"{label} ({self.axis} {self.group})"


@dataclass
class Gate:
    """The gate's outcome: every check, whether all passed, and the one line saying so."""

    options: GateOptions
    checks: list[Check]
    passed: bool
    line: str

    def to_json(self) -> dict:
        return asdict(self)


def _check(run: str, axis, group, samples: int, d: cmp.Delta, o: GateOptions) -> Check:
    ratio = d.mean_b / d.mean_a if d.mean_a else None
    c = Check(run, axis, group, samples, d.mean_a, d.mean_b, ratio, d.delta, d.low, d.high)
    if o.fail_below is not None and ratio is not None and ratio < o.fail_below:
        c.failed.append(f"{ratio:.3f} of BASE, below {o.fail_below:g}")
    if o.fail_if_worse and samples > 1 and d.high < 0:
        c.failed.append(f"interval [{d.low:+.3f}, {d.high:+.3f}] below 0")
    return c


def gate(pairs: list[cmp.Paired], o: GateOptions) -> Gate:
    """Each NEW of `pairs` (paired against BASE, `compare.paired`) through the gate."""
    label = registry.find(o.metric).header
    checks: list[Check] = []
    for p in pairs:
        if not p.comparable:
            line = f"gate failed: {p.b} is not comparable with {p.a}: {'; '.join(p.problems)}"
            return Gate(o, checks, False, line)
        d = cmp.headline(p.deltas, o.metric)
        if d is None:
            return Gate(o, checks, False, f"gate failed: no paired {label} for {p.b}")
        checks.append(_check(p.b, None, None, p.samples, d, o))
        for g in p.groups:
            gd = cmp.group_lead(g, o.metric)
            if g.axis in o.by and gd is not None:
                checks.append(_check(p.b, g.axis, g.name, g.samples, gd, o))
    failed = [c for c in checks if c.failed]
    if failed:
        worst = min(failed, key=lambda c: (c.ratio if c.ratio is not None else 0.0, c.delta))
        more = f"; {len(failed) - 1} more check(s) failed" if len(failed) > 1 else ""
        line = (
            f"gate failed: {worst.where(label)} of {worst.run}: {worst.new:.3f} vs BASE "
            f"{worst.base:.3f} ({worst.delta:+.3f}; {', '.join(worst.failed)}){more}"
        )
        return Gate(o, checks, False, line)
    c = checks[0]
    groups = len(checks) - len(pairs)
    line = (
        f"gate passed: {label} {c.new:.3f} vs BASE {c.base:.3f} ({c.delta:+.3f}, interval "
        f"[{c.low:+.3f}, {c.high:+.3f}]) over {c.samples} paired samples"
        + (f", {len(pairs)} runs" if len(pairs) > 1 else "")
        + (f", {groups} groups checked" if groups else "")
    )
    return Gate(o, checks, True, line)
