"""An earlier revision measured in the same run as this checkout: `worktree` checks a
pinned commit out as a detached git worktree in a temporary folder (removed after), and a
benchmark runs that tree's code in a child process (its CLI with ``PYTHONPATH``, or
`earlier_engine`), so a baseline is never a copy kept in the repository.

`earlier_engine` times #29's engine (`ENGINE_29`, the parent of the first commit drafting
only where rounds start: a block at every completion position, one sample at a time) in a
child that imports the worktree's ``remote/``; ``python -m common.baseline`` is that child.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import BENCHMARKS, ROOT

ENGINE_29 = "b4dc5237137d183244e61f9f6c09452118f50708"


class NoRevision(SystemExit):
    """This is no git checkout holding the revision (one line; a caller may go on)."""


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` of this repository checked out (detached) in a temporary folder; `NoRevision`
    where this is no git checkout holding ``rev``."""
    tmp = Path(tempfile.mkdtemp(prefix="dflash-bench-rev-"))
    tree = tmp / "tree"
    add = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev],
        capture_output=True,
        text=True,
    )
    if add.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        why = (add.stderr.strip().splitlines() or ["git failed"])[-1]
        raise NoRevision(f"baseline: no revision {rev} to measure ({why})")
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
        shutil.rmtree(tmp, ignore_errors=True)


def earlier_engine(tree: Path, dirs, samples_file: str, threads: int, clock: str, budgets):
    """One timed pass of the engine in ``tree`` (#29's API) over the samples in a child
    process: its records and the pass's wall and CPU seconds. Its bf16 products are computed
    as this checkout's engine computes them here (`remote.eval.cpu_bf16`)."""
    from remote.eval import cpu_bf16

    cmd = [sys.executable, "-m", "common.baseline", str(tree), *dirs, samples_file]
    cmd += [",".join(map(str, budgets)), str(threads), clock, cpu_bf16.policy()]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCHMARKS)
    if out.returncode != 0:
        raise SystemExit(f"baseline: the earlier engine failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def _engine_pass(tree, target_dir, drafter_dir, samples_file, budgets, threads, clock, bf16):
    """The child: #29's `remote.eval.walk.eval_sequence(target, drafter, prompt, completion,
    options)` over every sample after one untimed (first calls' costs); prints one JSON line."""
    sys.path.insert(0, tree)  # the worktree's `remote`, not this checkout's
    import torch

    from remote.eval import walk
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    if not walk.__file__.startswith(tree):
        sys.exit(f"baseline: imported {walk.__file__}, not the worktree's remote/")
    torch.set_num_threads(int(threads))
    if clock == "cpu":  # its parts are timed with time.perf_counter
        walk.time = types.SimpleNamespace(perf_counter=time.process_time)
    target = load_target(target_dir, torch.bfloat16)
    drafter, _report = load_drafter(drafter_dir, torch.bfloat16)
    samples = json.load(open(samples_file))
    opts = walk.WalkOptions(budgets=[int(b) for b in budgets.split(",") if b])
    with _todays_cpu_bf16().widened(bf16):
        walk.eval_sequence(target, drafter, *samples[0], opts)
        wall, cpu = time.perf_counter(), time.process_time()
        records = [walk.eval_sequence(target, drafter, p, c, opts) for p, c in samples]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"records": records, "wall": wall, "cpu": cpu}))


def _todays_cpu_bf16() -> types.ModuleType:
    """This checkout's `remote.eval.cpu_bf16` (which #29's engine lacks), loaded by path
    beside the worktree's `remote` (its one import, ``remote.errors``, is the worktree's)."""
    import importlib.util

    path = ROOT / "remote" / "eval" / "cpu_bf16.py"
    spec = importlib.util.spec_from_file_location("todays_cpu_bf16", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    _engine_pass(*sys.argv[1:])
