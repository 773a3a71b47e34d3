"""Peak memory of the ground-truth phase against a hostile server, as a ratio to an honest one.

A scripted SGLang server answers every ``POST /generate`` with `--mib` MiB: an id list far
longer than ``max_new_tokens`` (a server gone wrong, or one that means harm). The phase
(`remote.eval.groundtruth.prepare`, 16 requests in flight by default, as a job runs it) runs
in a fresh python process, once against that server and once against an honest one that
answers a few ids, in interleaved rounds; each process reports its own peak RSS (``VmHWM``:
its memory's high-water mark since it started; ``getrusage`` would count this process's
RSS at the fork too). Prints both peaks (medians), their ratio (goal: about 1: the hostile
answer is refused once it passes what a valid one can be, before it is parsed) and the one
line the hostile run ended with. ``--tree`` runs the phase from another source tree (an
older checkout, ``git archive REV | tar -x -C DIR``) for a before/after comparison; mind
the memory: before the bound, 286 MiB answers took over 13 GiB.

    python benchmarks/groundtruth_memory.py [--mib 286] [--prompts 16] [--rounds 1]
        [--until-close] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from orchestrator.demo.models import build_qwen3_target  # noqa: E402
from orchestrator.demo.servers import Raw, ScriptedServer, ids_reply  # noqa: E402

CHILD = """
import json, sys
from remote.errors import UserError
from remote.eval import groundtruth
spec = json.loads(sys.argv[1])
try:
    groundtruth.prepare(spec)
    ended = "ok"
except UserError as exc:
    ended = str(exc)
status = open("/proc/self/status").read().split("VmHWM:")[1]
peak = int(status.split()[0]) / 1024  # kB
print(json.dumps({"peak_mib": peak, "ended": ended}))
"""


def hostile_body(mib: int) -> bytes:
    """A valid SGLang answer of about `mib` MiB: one id repeated."""
    count = mib * (1 << 20) // 3
    return b'{"output_ids": [' + b"7, " * count + b'7], "meta_info": {}}'


def phase(
    tmp: Path, target: str, prompts: Path, url: str, concurrency: int, run: str, tree: str
) -> dict:
    spec = {
        "eval": {"target": target},
        "workdir": str(tmp / f"wd-{run}"),
        "prompts": {"path": str(prompts)},
        "seed": 0,
        "sampling": {"temperature": 0, "max_new_tokens": 16},
        "ground_truth": {"kind": "sglang", "url": url, "concurrency": concurrency},
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": tree},
        timeout=1800,
    )
    if proc.returncode:
        raise SystemExit(f"the phase's process failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=286, help="size of each hostile answer")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tree", default=ROOT, help="source tree the phase runs from")
    ap.add_argument(
        "--until-close",
        action="store_true",
        help="send the hostile answer without a Content-Length (it ends when the server hangs up)",
    )
    args = ap.parse_args()
    body = hostile_body(args.mib)
    peaks: dict[str, list[float]] = {"honest": [], "hostile": []}
    ended = ""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        target = build_qwen3_target(str(tmp / "target"))
        prompts = tmp / "prompts.jsonl"
        prompts.write_text(
            "".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(args.prompts))
        )
        honest = ScriptedServer(ids_reply([5, 6, 7]))
        hostile = ScriptedServer(lambda path, req: Raw(body, length=not args.until_close))
        try:
            for r in range(args.rounds):
                for name, server in (("honest", honest), ("hostile", hostile)):
                    out = phase(
                        tmp, target, prompts, server.url, args.concurrency, f"{name}{r}", args.tree
                    )
                    peaks[name].append(out["peak_mib"])
                    if name == "hostile":
                        ended = out["ended"]
        finally:
            honest.stop()
            hostile.stop()
    base, bad = statistics.median(peaks["honest"]), statistics.median(peaks["hostile"])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"ground-truth phase peak RSS, {args.prompts} prompts, {args.concurrency} in flight, "
        f"hostile answers of {args.mib} MiB"
        f"{' without a Content-Length' if args.until_close else ''}, {args.rounds} round(s), "
        f"code from {args.tree}, "
        f"load avg {load}"
    )
    print(f"  honest server:   {base:8.0f} MiB")
    print(f"  hostile server:  {bad:8.0f} MiB")
    print(f"  hostile / honest: {bad / base:7.2f}x  (goal about 1)")
    print(f"  the hostile run ended with: {ended[:300]}")


if __name__ == "__main__":
    main()
