"""An earlier commit's eval engine on given samples: a benchmark's "before", measured in the
same run as today's code (`eval_drafter_share.py --before`).

    python benchmarks/engine_before.py TREE TARGET DRAFTER SAMPLES [--budgets 8,16,32,64]
        [--threads 1] [--clock cpu|wall]

TREE holds that commit's ``remote/`` (``git archive REV remote``), imported instead of this
checkout's; SAMPLES is a JSON list of ``[prompt_ids, completion_ids]``. The engine of that
commit evaluates one sample untimed (its first calls' costs), then every sample, one at a
time, with its own defaults but for the budgets; prints one JSON object: each sample's
record (rounds, DDTree rounds, seconds by part on ``--clock``) and the whole pass's wall
and CPU seconds. Written against the engine before round-start drafting (e21d99a^), whose
`remote.eval.walk.eval_sequence` takes (target, drafter, prompt, completion, options).
``--bf16-products``: how its bfloat16 products are computed, with this checkout's
`remote.eval.cpu_bf16` (which that commit lacks), so both engines multiply alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("tree", "target", "drafter", "samples"):
        ap.add_argument(name)
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--bf16-products", choices=("native", "float32"), default="native")
    args = ap.parse_args()
    sys.path.insert(0, args.tree)  # that commit's `remote`, not this checkout's

    import torch

    from remote.eval import walk
    from remote.eval.drafter import load_drafter
    from remote.eval.target import load_target

    if not walk.__file__.startswith(args.tree):
        sys.exit(f"engine_before: imported {walk.__file__}, not the tree's own remote/")
    torch.set_num_threads(args.threads)
    if args.clock == "cpu":  # its parts are timed with time.perf_counter
        walk.time = types.SimpleNamespace(perf_counter=time.process_time)
    target = load_target(args.target, torch.bfloat16)
    drafter, _report = load_drafter(args.drafter, torch.bfloat16)
    samples = json.load(open(args.samples))
    budgets = [int(b) for b in args.budgets.split(",") if b]
    opts = walk.WalkOptions(budgets=budgets)
    with todays_cpu_bf16().widened(args.bf16_products):
        walk.eval_sequence(target, drafter, *samples[0], opts)
        wall, cpu = time.perf_counter(), time.process_time()
        records = [walk.eval_sequence(target, drafter, p, c, opts) for p, c in samples]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"records": records, "wall": wall, "cpu": cpu}))


def todays_cpu_bf16() -> types.ModuleType:
    """This checkout's `remote.eval.cpu_bf16`, loaded by path beside the tree's `remote`
    (its one import, ``remote.errors``, is the tree's)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "remote" / "eval" / "cpu_bf16.py"
    spec = importlib.util.spec_from_file_location("todays_cpu_bf16", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
