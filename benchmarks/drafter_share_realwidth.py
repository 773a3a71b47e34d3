"""The drafter share of `eval_drafter_share.py` at a 27B's real width, composed.

The trained pair's drafter is 256 wide: there a drafter call's fixed cost (its many small
torch ops, whatever its blocks) weighs as much as several blocks, so a walk of a few
samples, whose calls hold a few blocks, pays it far more often than the all-positions
engine. At 5120 wide the calls' matrix work and the weights each call reads (and widens,
on a CPU without bf16 kernels) weigh instead. This script
prices each mode's drafter calls at both widths:

1. The calls: the trained pair (`common.pair`, trained on 64 samples unless
   ``--train-samples`` says otherwise; cached, or trained once) runs each mode (``all``
   and ``walk``, the chain walk alone and with the DDTree budgets) once per sample count
   (``--sample-counts``), and every drafter primitive call is logged with its size: a build of
   ``n`` blocks (`Blocks`: every layer but the last on 16 rows a block), ``r`` rows through
   the last layer, ``r`` rows through the head (with the DDTree top-k where the budgets
   ask for it), ``T`` context rows (`DFlashDrafter.context_kv`), each as the drafter or
   the DDTree part. At the real width the engine drafts fewer blocks a call
   (`drafts.auto_chunk` of the real drafter) and fewer rows a head call
   (`Drafts.rows_per_head` of the real vocabulary): the calls are logged at those.
2. The prices: each primitive timed at a grid of sizes (median of ``--repeats``) on a
   5-layer drafter of z-lab's Qwen3.6-27B drafter's width (`common.realwidth.DRAFTER`,
   random weights, features of 4 layers) with Qwen3.6-27B's vocabulary (248320 rows), and
   on the pair's own drafter; between grid sizes linearly, past the largest in proportion.
3. The composed drafter part of each mode, at each width, and the ratio walk / all against
   the goal 1.3 / tau; at the pair's width the measured ratio beside the composed one, the
   check that the composition holds.

    python benchmarks/drafter_share_realwidth.py [--sample-counts 4,64] [--threads 2] [--repeats 3]
        [--real-layers 5]
"""

from __future__ import annotations

import bisect
import statistics
import time
import types
from collections import Counter
from contextlib import contextmanager
from functools import partial

from common.measure import goal, interleave, load_avg, loads, median_seconds
from common.pair import budget_list, loaded, parser, tau
from common.realwidth import drafter_config
from eval_drafter_share import walks_starts

REAL_LAYERS = 5
BUILD_GRID = (1, 2, 4, 8, 16, 32)
ROWS_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Calls:
    """The drafter primitive calls made inside `logging`: ``(part, primitive, size)``
    counted, part ``drafter`` or ``ddtree`` (inside a tree search)."""

    def __init__(self):
        self.counts: Counter = Counter()
        self._tree = 0

    @contextmanager
    def logging(self):
        from remote.eval import drafter_model
        from remote.eval.drafts import Drafts

        Blocks, Drafter = drafter_model.Blocks, drafter_model.DFlashDrafter
        saved = (Blocks.__init__, Blocks._last_layer, Drafts.head, Drafts._search)
        saved += (Drafter.context_kv,)
        calls = self

        def note(prim: str, size: int) -> None:
            calls.counts[("ddtree" if calls._tree else "drafter", prim, size)] += 1

        def init(self, drafter, kv, starts, blocks, *a, **kw):
            note("build", blocks.shape[0])
            saved[0](self, drafter, kv, starts, blocks, *a, **kw)

        def last(self, h, *a):
            note("last", h.shape[0] * h.shape[1])
            return saved[1](self, h, *a)

        def head(self, h, keys, depths):
            note("head+topk" if self.k else "head", h.shape[0])
            return saved[2](self, h, keys, depths)

        def search(self, *a):
            calls._tree += 1
            try:
                return saved[3](self, *a)
            finally:
                calls._tree -= 1

        def context_kv(self, features):
            note("context", features.shape[0])
            return saved[4](self, features)

        Blocks.__init__, Blocks._last_layer, Drafts.head, Drafts._search = init, last, head, search
        Drafter.context_kv = context_kv
        try:
            yield self
        finally:
            Blocks.__init__, Blocks._last_layer, Drafts.head, Drafts._search = saved[:4]
            Drafter.context_kv = saved[4]


def walk_calls(m, samples, positions: str, budgets: list[int], chunk: int | None):
    """(the calls of one eval of ``samples``, its records)."""
    from remote.eval.walk import WalkOptions, eval_batch

    opts = WalkOptions(budgets=budgets, positions=positions, block_chunk=chunk)
    with Calls().logging() as calls:
        recs = eval_batch(m.target, m.drafter, samples, opts)
    return calls.counts, recs


def timed(fn, repeats: int) -> float:
    return median_seconds(fn, repeats, warm=True)  # warm: the widening buffer, the allocator


def prices(drafter, lm_head, embed, T: int, k: int, repeats: int) -> dict[str, dict[int, float]]:
    """Seconds of each primitive at the grid sizes, on ``drafter`` and that head, a context
    of ``T`` positions; the head with and without the top-``k`` of DDTree."""
    import torch

    from remote.eval.drafts import Drafts, Seq

    F = len(drafter.cfg.target_layer_ids) * drafter.cfg.hidden_size
    gen = torch.Generator().manual_seed(0)
    feats = (torch.randn(T, F, generator=gen) * 0.5).to(lm_head.dtype)
    g = torch.randint(10, lm_head.shape[0], (T + 1,), generator=gen)
    kv = drafter.context_kv(feats)
    target = types.SimpleNamespace(lm_head=lm_head, embed=embed)
    P = T - max(BUILD_GRID) - 16
    d = Drafts(drafter, target, [Seq(g, P, kv)], None)
    keys = [(0, P + j) for j in range(max(BUILD_GRID))]
    out: dict[str, dict[int, float]] = {"build": {}, "last": {}, "head": {}, "head+topk": {}}
    out["context"] = {T: timed(lambda: drafter.context_kv(feats), repeats)}
    for n in BUILD_GRID:
        out["build"][n] = timed(lambda n=n: d._build(keys[:n]), repeats)
    blocks = d._build(keys)[0]
    hidden = torch.randn(max(ROWS_GRID), drafter.cfg.hidden_size, generator=gen).to(lm_head.dtype)
    for r in ROWS_GRID:
        w = min(r, 8)
        idx = torch.arange(r // w)
        out["last"][r] = timed(lambda idx=idx, w=w: blocks.depths(idx, 1, w), repeats)
        for name, kk in (("head", 0), ("head+topk", k)):
            d.k = kk
            got = timed(lambda r=r: d.head(hidden[:r], [(0, P)] * r, [99] * r), repeats)
            out[name][r] = got
    d.k = 0
    return out


def price(curve: dict[int, float], n: int) -> float:
    """Seconds of a call of size ``n``: linear between the grid's sizes, in proportion past
    its largest."""
    sizes = sorted(curve)
    if n in curve:
        return curve[n]
    if n > sizes[-1]:
        return curve[sizes[-1]] * n / sizes[-1]
    j = bisect.bisect(sizes, n)
    a, b = sizes[max(0, j - 1)], sizes[j]
    if n < a:
        return curve[a]
    return curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)


def composed(counts: Counter, curves: dict, head_rows: int) -> dict[str, float]:
    """The drafter and DDTree parts of ``counts`` at ``curves``' prices, and the drafter
    part's of each primitive; a head call is priced as the engine at that width makes it,
    ``head_rows`` rows at a time."""
    parts = {"drafter": 0.0, "ddtree": 0.0} | {p: 0.0 for p in curves}
    for (part, prim, n), times in counts.items():
        if prim.startswith("head"):
            full, rest = divmod(n, head_rows)
            cost = full * price(curves[prim], head_rows) + (rest and price(curves[prim], rest))
        elif prim == "context":
            cost = curves["context"][min(curves["context"])] * n / min(curves["context"])
        else:
            cost = price(curves[prim], n)
        parts[part] += times * cost
        if part == "drafter":
            parts[prim] += times * cost
    return parts


def floor(all_parts: dict[str, float], records: list[dict]) -> float:
    """The drafter part an exact walk needs / the all-positions one, at the same prices
    per block: builds at the union of every walk's round starts, acceptance (last layer
    and head) at the chain walk's, the context as before. The builds are a bound; the
    acceptance is priced at every depth, where the walk stops at a block's first miss, so
    a walk can come in a little under it."""
    positions = sum(r["completion_tokens"] - 1 for r in records)  # the blocks of "all"
    union = sum(len(walks_starts(r)) for r in records) / positions
    chain = sum(len(r["rounds"]) for r in records) / positions
    accept = all_parts["last"] + all_parts["head"] + all_parts["head+topk"]
    least = union * all_parts["build"] + chain * accept + all_parts["context"]
    return least / all_parts["drafter"]


def measured(m, samples, budgets: list[int], repeats: int) -> float:
    """The drafter part walk / all positions as the engine measures it, the modes
    interleaved: the median of ``repeats`` rounds' ratios."""
    from common.pair import engine

    def drafter(mode: str) -> dict[str, float]:
        recs = engine(m.target, m.drafter, samples, mode, budgets)
        return {"drafter": sum(r["seconds"]["drafter"] for r in recs)}

    rounds = interleave({mode: partial(drafter, mode) for mode in ("all", "walk")}, repeats)
    return statistics.median(rounds.per_round("walk", "all", "drafter"))


def real_drafter(layers: int):
    """A random real-width drafter: z-lab's Qwen3.6-27B drafter's shape, ``layers`` layers."""
    import torch

    from remote.eval.drafter import DFlashDrafter, DrafterConfig

    cfg = drafter_config(layers, 64, [1, 16, 31, 46])
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # no float32 copy of 2B weights on the way
    try:
        drafter = DFlashDrafter(DrafterConfig.from_dict(cfg)).eval()
    finally:
        torch.set_default_dtype(before)
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    head = torch.empty(vocab, hidden, dtype=torch.bfloat16).normal_(0, 0.02)
    return drafter, head


def main() -> None:
    import torch

    from remote.eval.device import computing
    from remote.eval.drafts import Drafts, auto_chunk
    from remote.eval.metrics import ddtree_k

    ap = parser(__doc__)
    ap.set_defaults(repeats=3, train_samples=64)
    ap.add_argument("--sample-counts", default="4,64", help="sample counts to log the calls at")
    ap.add_argument("--real-layers", type=int, default=REAL_LAYERS, help="the real-width drafter's")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    counts_at = [int(x) for x in args.sample_counts.split(",")]
    budgets = budget_list(args)
    before = load_avg()
    args.samples = max(counts_at)
    m = loaded(args)
    real, head = real_drafter(args.real_layers)
    T = max(len(p) + len(c) - 1 for p, c in m.samples)
    width = {
        "pair": (None, Drafts.rows_per_head(m.target.lm_head.shape[0])),
        "real": (auto_chunk(real.cfg, T), Drafts.rows_per_head(head.shape[0])),
    }
    print(
        f"pair: {m.drafter.cfg.num_layers}-layer drafter {m.drafter.cfg.hidden_size} wide; "
        f"real width: {args.real_layers} layers {real.cfg.hidden_size} wide, vocabulary "
        f"{head.shape[0]}, {width['real'][0]} blocks a call, {width['real'][1]} rows a head "
        f"call; {args.threads} threads"
    )
    logs, recs, checks = {}, {}, {}
    sets = {"chain only": [], f"DDTree {args.budgets}": budgets}
    with torch.inference_mode(), computing(torch.device("cpu")):
        for n in counts_at:
            samples = m.samples[:n]
            for name, bs in sets.items():
                for w, (chunk, _rows) in width.items():
                    if w == "pair" and n != min(counts_at):
                        continue  # the composition's check, at the fewest samples
                    for mode in ("all", "walk"):
                        t = time.process_time()
                        logs[(n, name, w, mode)], recs[(n, name, mode)] = walk_calls(
                            m, samples, mode, bs, chunk
                        )
                        print(
                            f"  logged {n} samples, {name}, {mode}, {w} width's calls: "
                            f"{sum(logs[(n, name, w, mode)].values())} "
                            f"({time.process_time() - t:.0f} CPU s)"
                        )
                    if w == "pair":
                        checks[(n, name)] = measured(m, samples, bs, args.repeats)
        k = {"pair": m.target.lm_head.shape[0], "real": head.shape[0]}
        k = {w: ddtree_k(max(budgets), None, v) for w, v in k.items()}
        curves = {
            "pair": prices(m.drafter, m.target.lm_head, m.target.embed, T, k["pair"], args.repeats),
            "real": prices(real, head, head, T, k["real"], args.repeats),
        }
    for w, c in curves.items():
        per_block = c["build"][max(BUILD_GRID)] / max(BUILD_GRID)
        per_row = c["head"][max(ROWS_GRID)] / max(ROWS_GRID)
        print(
            f"{w} width: a build of 1 block {1e3 * c['build'][1]:.1f} ms, of "
            f"{max(BUILD_GRID)} {1e3 * per_block:.1f} ms a block (the fixed cost: "
            f"{c['build'][1] / per_block:.1f} blocks); the head of 1 row "
            f"{1e3 * c['head'][1]:.1f} ms, of {max(ROWS_GRID)} {1e3 * per_row:.2f} ms a row"
        )
    results = {}
    for n in counts_at:
        tau_n = tau(recs[(n, "chain only", "walk")])
        for name in sets:
            for w, (_chunk, rows) in width.items():
                if (n, name, w, "all") not in logs:
                    continue
                a = composed(logs[(n, name, w, "all")], curves[w], rows)
                b = composed(logs[(n, name, w, "walk")], curves[w], rows)
                ratio = results[(n, name, w)] = b["drafter"] / a["drafter"]
                note = (
                    f"tau {tau_n:.2f}; {b['drafter']:.1f} s vs {a['drafter']:.1f} s; floor "
                    f"{floor(a, recs[(n, name, 'walk')]):.3f}"
                )
                if (n, name) in checks and w == "pair":
                    note += (
                        f"; measured, {args.repeats} rounds interleaved: {checks[(n, name)]:.2f}"
                    )
                goal(
                    f"{n} samples, {name}, {w} width: drafter part walk / all, composed",
                    ratio,
                    "<=",
                    round(1.3 / tau_n, 3),
                    note,
                )
    print(loads(before))
    last = "; ".join(
        f"{n} {'chain' if not bs else 'DDTree'} {results[(n, name, 'real')]:.2f}"
        for n in counts_at
        for name, bs in sets.items()
    )
    print(f"drafter share at real width (walk / all, composed): {last}; load {load_avg()}")


if __name__ == "__main__":
    main()
