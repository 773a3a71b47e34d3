"""How the benchmarks measure: interleaved rounds on two clocks, medians and bests, the
load average beside every figure, goal lines, a fresh child's peak RSS.

A figure is a ratio of two runs made in the same rounds: each round runs every mode once,
the order reversed every other round, so a load that drifts through a sitting weighs on
every mode alike. A goal not met is a line of output, never a failure.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import ROOT


def load_avg() -> str:
    """The 1, 5 and 15-minute load averages, as every benchmark prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def load_now() -> str:
    """The 1-minute load average and the core count, printed beside a round's figures."""
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def loads(before: str) -> str:
    """The line that puts a sitting's load average before and after beside its figures."""
    return f"load average (1, 5, 15 min): {before} before, {load_avg()} after"


@dataclass
class Rounds:
    """Every figure of every mode, one value a round: ``wall`` and ``cpu`` (process CPU
    seconds) always, and whatever numbers the mode returned (its parts' seconds)."""

    figures: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    rounds: int = 0

    def add(self, mode: str, got: dict[str, float]) -> None:
        for key, value in got.items():
            self.figures.setdefault(mode, {}).setdefault(key, []).append(value)

    def median(self, mode: str, key: str = "wall") -> float:
        return statistics.median(self.figures[mode][key])

    def best(self, mode: str, key: str = "wall") -> float:
        return min(self.figures[mode][key])

    def medians(self) -> dict[str, dict[str, float]]:
        """Each mode's median of each figure."""
        return {
            mode: {k: statistics.median(v) for k, v in figs.items()}
            for mode, figs in self.figures.items()
        }

    def per_round(self, mode: str, base: str, key: str = "wall") -> list[float]:
        """``mode``'s figure over ``base``'s, round by round."""
        pairs = zip(self.figures[mode][key], self.figures[base][key], strict=True)
        return [a / b for a, b in pairs]


def median_seconds(fn: Callable[[], object], repeats: int, warm: bool = False) -> float:
    """The median wall seconds of ``repeats`` calls of ``fn``; after one untimed call where
    ``warm``."""
    if warm:
        fn()
    spent = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - t)
    return statistics.median(spent)


def interleave(
    modes: dict[str, Callable[[], dict[str, float] | None]],
    rounds: int,
    out: Rounds | None = None,
) -> Rounds:
    """Run every mode once a round for ``rounds`` rounds, in turn, the order reversed every
    other round, each timed on the wall and process-CPU clocks. A mode may return a dict of
    more figures (its parts), which may also replace ``wall`` and ``cpu`` (a child's timed
    pass, without its start); ``out``: rounds to add to (a mode measured in parts)."""
    out = out or Rounds()
    names = list(modes)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            got = modes[name]() or {}
            spent = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
            out.add(name, {**spent, **got})
        out.rounds += 1
    return out


def goal(label: str, value: float, op: str, bound: float, note: str = "", digits: int = 2) -> bool:
    """Print ``label = value   (goal OP bound: met|NOT met; note)``; whether it is met."""
    met = value <= bound if op == "<=" else value >= bound
    more = f"; {note}" if note else ""
    print(
        f"{label} = {value:.{digits}f}   (goal {op} {bound:g}: {'met' if met else 'NOT met'}{more})"
    )
    return met


def spread(xs: list[float], unit: str = "x") -> str:
    """``min-max (median m)`` of round-by-round ratios."""
    return f"{min(xs):.2f}-{max(xs):.2f}{unit} (median {statistics.median(xs):.2f}{unit})"


HWM_WRAPPER = """
import atexit, runpy, sys
def hwm():
    # VmHWM is per address space: it starts afresh at exec, unlike ru_maxrss, which a forked
    # child inherits from its (large) parent
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            sys.stderr.write('VMHWM ' + line.split()[1] + chr(10))
atexit.register(hwm)
sys.argv = sys.argv[1:]
if sys.argv[0] == '-m':
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
else:  # -c CODE ARGS...: the code sees its ARGS as under python -c
    code, sys.argv = sys.argv[1], ['-c', *sys.argv[2:]]
    exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})
"""


@dataclass
class Child:
    peak: int  # bytes: the child's own high-water mark (VmHWM)
    wall: float  # seconds, start to exit
    stdout: str


def run_child(args: list[str], cwd: str | os.PathLike = ROOT) -> Child:
    """A fresh Python child running ``-m module args...`` or ``-c code`` from ``cwd`` (this
    checkout by default; a baseline's worktree), with its peak RSS."""
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", HWM_WRAPPER, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)},
    )
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"child {args[:2]} failed: {proc.stderr[-2000:]}")
    kib = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("VMHWM ")]
    return Child(kib[-1] * 1024, wall, proc.stdout)
