"""How much memory does each host-side step hold, against what it must?

    python benchmarks/memory.py [--only eval,probe,groundtruth]

Each step runs in a fresh python child whose own high-water mark (``VmHWM``) is its peak
RSS (`common.measure.run_child`); nothing is asserted:

* ``eval``: ``python -m remote eval`` (random ground truth, ``--samples`` x (``--prompt`` +
  ``--completion``)) over the weights' bytes (goal <= 1.3), beside the fixed runtime
  (python, torch, transformers, the target's modeling code), on a random Qwen3 target
  (``--hidden``/``--layers``/``--vocab``, ~0.9 GB), a bigger one (``--rss-hidden``/
  ``--rss-layers``, ~2.4 GB) and a Qwen3.5-MoE VLM (``--moe-*``, ~2 GB: per-expert keys the
  loader fuses as transformers does, vision weights never read);
* ``probe``: ``python -m remote probe`` of a Qwen3.6-27B-shaped config with no weights on
  disk, over the bytes a full load needs, beside ``import torch, transformers``;
* ``groundtruth``: the ground-truth phase (`remote.eval.groundtruth.prepare`, 16 requests
  in flight) against a scripted SGLang server answering every request with ``--mib`` MiB
  (an id list far longer than ``max_new_tokens``: a server gone wrong, or one that means
  harm), over the same phase against an honest one (goal about 1: the answer is refused
  once it passes what a valid one can be, before it is parsed); ``--baseline REV`` runs
  that revision's phase too (a git worktree; before the bound, 286 MiB answers took over
  13 GiB).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from common import ROOT
from common.baseline import worktree
from common.measure import interleave, load_avg, run_child
from common.models import QWEN36_27B, build, build_moe, eval_rss, random_seqs

from orchestrator.demo.models import build_qwen3_target
from orchestrator.demo.servers import Raw, ScriptedServer, ids_reply

GT_CHILD = """
import json, sys
from remote.errors import UserError
from remote.eval import groundtruth
try:
    groundtruth.prepare(json.loads(sys.argv[1]))
    ended = "ok"
except UserError as exc:
    ended = str(exc)
print(json.dumps({"ended": ended}))
"""


def eval_rows(args) -> None:
    """Peak RSS of ``remote eval`` over the weights, on each target."""
    prompts, seqs = random_seqs(args.vocab, args.samples, args.prompt, args.completion)
    targets = {f"{args.layers} x {args.hidden}": (args.hidden, args.layers, 0)}
    if args.rss_hidden:
        targets[f"{args.rss_layers} x {args.rss_hidden}"] = (args.rss_hidden, args.rss_layers, 0)
    if args.moe_hidden:
        label = f"MoE VLM {args.moe_layers} x {args.moe_hidden}, {args.moe_experts} experts"
        targets[label] = (args.moe_hidden, args.moe_layers, args.moe_experts)
    for label, (hidden, layers, experts) in targets.items():
        if experts:
            dirs = build_moe(args.workdir, hidden, layers, experts, args.vocab)
        else:
            dirs = build(args.workdir, hidden, layers, args.vocab)
        peak, base, weights = eval_rss(*dirs, prompts, seqs, args.threads)
        print(
            f"peak RSS of `remote eval` / weights' bytes [{label}] = {peak / weights:.2f}   "
            f"(goal <= 1.3; peak {peak / 2**20:.0f} MiB, weights {weights / 2**20:.0f} MiB)"
        )
        print(
            f"  fixed runtime (python+torch+transformers+modeling code) {base / 2**20:.0f} MiB; "
            f"(peak - runtime) / weights = {(peak - base) / weights:.2f}"
        )


def probe_rows(args) -> None:
    """The probe's peak RSS and wall against a full load's bytes and the imports alone."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3.6-27b-config-only"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(QWEN36_27B))
        base = run_child(["-c", "import torch, transformers, safetensors"])
        probe = run_child(["-m", "remote", "probe", "--model", str(folder), "--depth", "3"])
    report = json.loads(probe.stdout)
    p, text = report["parameters"], report["text"]
    full, gib = p["total"]["bytes"], 1024**3
    print(
        f"probe: {report['built_class']}, {text['num_layers']} layers at {text['layers']}, "
        f"hidden {text['hidden_size']}, {text['layer_types_config']}"
    )
    print(
        f"  params: total {p['total']['params'] / 1e9:.2f} B, text {p['text']['params'] / 1e9:.2f}"
        f" B, vision {p['vision']['params'] / 1e9:.3f} B; a full load ({report['dtype']}): "
        f"{full / gib:.2f} GiB, text only {p['text']['bytes'] / gib:.2f} GiB"
    )
    print(
        f"  import torch+transformers: {base.wall:.2f} s, peak RSS {base.peak / 2**20:.0f} MiB; "
        f"probe: {probe.wall:.2f} s wall (inside: {report['probe_seconds']:.2f} s), peak RSS "
        f"{probe.peak / 2**20:.0f} MiB ({(probe.peak - base.peak) / 2**20:.0f} over the imports)"
    )
    print(f"  peak RSS / full-load bytes: {probe.peak / full:.4f}  (1/{full / probe.peak:.0f})")


def groundtruth_rows(args) -> None:
    """The ground-truth phase's peak RSS against a hostile server over an honest one's."""
    count = args.mib * (1 << 20) // 3  # a valid SGLang answer of about --mib MiB
    body = b'{"output_ids": [' + b"7, " * count + b'7], "meta_info": {}}'
    ended: dict[str, str] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        honest = ScriptedServer(ids_reply([5, 6, 7]))
        stack.callback(honest.stop)
        hostile = ScriptedServer(lambda path, req: Raw(body, length=not args.until_close))
        stack.callback(hostile.stop)
        target = build_qwen3_target(str(tmp / "target"))
        prompts = tmp / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": f"Q {i}?"}) + "\n" for i in range(16)))
        trees = {"this": ROOT}
        if args.baseline:
            trees[args.baseline[:12]] = stack.enter_context(worktree(args.baseline))

        def phase(label: str, server: ScriptedServer) -> dict:
            spec = {
                "eval": {"target": target},
                "workdir": tempfile.mkdtemp(dir=tmp),
                "prompts": {"path": str(prompts)},
                "seed": 0,
                "sampling": {"temperature": 0, "max_new_tokens": 16},
                "ground_truth": {"kind": "sglang", "url": server.url, "concurrency": 16},
            }
            child = run_child(["-c", GT_CHILD, json.dumps(spec)], cwd=trees[label])
            ended[label] = json.loads(child.stdout.splitlines()[-1])["ended"]
            return {"peak": child.peak / 2**20}

        runs = {}
        for label in trees:
            runs[f"{label} honest"] = partial(phase, label, honest)
            runs[f"{label} hostile"] = partial(phase, label, hostile)
        got = interleave(runs, args.rounds)
    print(
        f"ground-truth phase peak RSS, 16 prompts, 16 in flight, hostile answers of {args.mib} MiB"
        f"{' without a Content-Length' if args.until_close else ''}, median of {args.rounds}"
    )
    for label in trees:
        good, bad = got.median(f"{label} honest", "peak"), got.median(f"{label} hostile", "peak")
        print(
            f"  {label}: honest {good:.0f} MiB, hostile {bad:.0f} MiB: hostile / honest "
            f"{bad / good:.2f}x  (goal about 1); the hostile run ended with: {ended[label][:300]}"
        )


SECTIONS = {"eval": eval_rows, "probe": probe_rows, "groundtruth": groundtruth_rows}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default=",".join(SECTIONS), help="some of: " + ",".join(SECTIONS))
    ap.add_argument("--workdir", default="/tmp/dflash-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rss-hidden", type=int, default=2048, help="the bigger target (0: skip)")
    ap.add_argument("--rss-layers", type=int, default=24)
    ap.add_argument("--moe-hidden", type=int, default=1024, help="the MoE VLM target (0: skip)")
    ap.add_argument("--moe-layers", type=int, default=12)
    ap.add_argument("--moe-experts", type=int, default=48)
    ap.add_argument("--mib", type=int, default=286, help="size of each hostile answer")
    ap.add_argument("--until-close", action="store_true", help="hostile answers without a length")
    ap.add_argument("--rounds", type=int, default=1, help="ground truth: interleaved rounds")
    ap.add_argument("--baseline", help="ground truth: also this revision's phase (a commit)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    if unknown := [n for n in names if n not in SECTIONS]:
        raise SystemExit(f"unknown --only {','.join(unknown)}: choose from {','.join(SECTIONS)}")
    print(f"load average before: {load_avg()}")
    for name in names:
        SECTIONS[name](args)
    print(f"load average after: {load_avg()}")


if __name__ == "__main__":
    main()
