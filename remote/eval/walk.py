"""The offline (teacher-forced) acceptance walk (its dataset metrics: `remote.eval.metrics`).

Per sequence ``g = prompt + completion`` (``P`` prompt tokens, last index ``L``):

1. ONE target forward over ``g``: context features of every position (hooks) and the
   target's own greedy argmax (for the agreement rate). Then the drafter's context K/V
   once, and the features are dropped.
2. The walk, exactly as greedy online decoding: ``s = P``; draft the block at ``s``,
   ``a_s`` = leading draft tokens equal to ``g[s+1..]`` (capped at ``L``); round length
   ``min(a_s + 1, L - s)``; ``s += length``; stop at ``L``. (The first completion token
   comes from the target's prefill, as in z-lab's loop, and is not a round.) Blocks are
   always ``B`` long, as in a generation that ends on EOS. The samples of a batch walk in
   lockstep, and with them the DDTree walks of step 3 (`walk_rounds`): each step drafts,
   in ONE drafter call, the blocks every unfinished walk asks for and no earlier step
   drafted, so the drafter's rows are about rounds x ``B``, not positions x ``B``, and a
   block is drafted once for all the walks that start rounds there. The last drafter
   layer and the head run depth by depth, only for blocks still matching: about tau rows
   per block instead of ``B``
   (`remote.eval.drafter_model.Blocks`). With ``positions="all"`` every completion position's
   block is drafted first (batched), for per-position acceptance over all of them.
3. DDTree-N walks the same way with tree acceptance, from per-depth top-k log-probs of the
   drafter at the positions that walk visits. One `remote.eval.ddtree.TreeSearch` per
   visited position answers every budget at once (a smaller budget's tree is the first
   nodes of the largest one's), and asks for a depth's row only when the best-first order
   reaches it or the ground truth is still in the tree: the rows step 2 computed are
   reused, and so are the blocks (their last layer's inputs, `remote.eval.drafts.Drafts`
   keeps them), so a deeper row costs the last layer and the head only; a drafter that
   misses at depth 1 costs no more rows. The walks of all budgets and samples advance with
   the greedy ones, computing what they need in shared batches (`walk_rounds`).

Memory stays flat in the sequence length: drafter blocks, attention scores and head logits
go in batches of bounded bytes (`remote.eval.drafts`, which drafts and keeps the blocks),
the samples walking together are bounded by their context K/V's bytes
(`lockstep_batches`), DDTree keeps top-k rows (not logits) only for positions a walk can
still visit, and large buffers go back to the OS when freed (`bound_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
from dataclasses import dataclass, field

import torch

from remote.eval import drafts as _drafts
from remote.eval.drafts import Drafts, Seq

# The metrics live in a torch-free module shared with the orchestrator's shard merge;
# re-exported here for callers that know them from this module.
from remote.eval.metrics import ddtree_k, summarize  # noqa: F401


@dataclass
class WalkOptions:
    """``budgets``: DDTree node budgets; ``topk``: per-depth candidates (None = the budget);
    ``block_chunk``: blocks per batched drafter call (memory vs speed; None = as many as
    `remote.eval.drafts.auto_chunk` allows); ``positions``: ``"walk"`` (the
    default) drafts blocks only where the walks start rounds, the chain walk's and each
    DDTree budget's (and, after a short round, the few positions its next rounds likely
    start at: `ahead`), the samples of a batch in lockstep, each step's blocks in shared
    drafter calls (per-position acceptance then covers the chain walk's round starts);
    ``"all"`` (opt-in) also drafts a block at every completion position first, so
    per-position acceptance covers all of them, as docs/dflash-eval.md describes it (the
    same rounds)."""

    budgets: list[int] = field(default_factory=list)
    topk: int | None = None
    block_chunk: int | None = None
    positions: str = "walk"


LOCKSTEP_SAMPLES = 16  # samples walked in lockstep at most (one batch of `eval_batch`)
LOCKSTEP_BYTES = 256 * 2**20  # their drafter context K/V together, at most


def context_kv_bytes(cfg, tokens: int, itemsize: int) -> int:
    """Bytes of the drafter's context K/V (every layer) for a sequence of ``tokens``."""
    return cfg.num_layers * 2 * tokens * cfg.num_kv_heads * cfg.head_dim * itemsize


def lockstep_batches(lengths: list[int], cfg, itemsize: int, positions: str) -> list[range]:
    """Consecutive samples (by index) to evaluate together with `eval_batch`: with
    ``positions="walk"`` up to LOCKSTEP_SAMPLES whose context K/V stay within
    LOCKSTEP_BYTES (one sample at least), so each drafter call holds a block of every
    sample still walking; with ``"all"`` one sample each, whose every position already
    fills large calls."""
    cap = LOCKSTEP_SAMPLES if positions == "walk" else 1
    out, first, held = [], 0, 0
    for i, n in enumerate(lengths):
        size = context_kv_bytes(cfg, n, itemsize)
        if i > first and (i - first >= cap or held + size > LOCKSTEP_BYTES):
            out.append(range(first, i))
            first, held = i, 0
        held += size
    if lengths:
        out.append(range(first, len(lengths)))
    return out


def _share(seconds: float, weights: list[int], into: list[float]) -> None:
    """Add ``seconds`` of a batched step to ``into``, split by each sequence's ``weights``
    (its blocks or walks in that step)."""
    total = sum(weights)
    for i, w in enumerate(weights):
        if w:
            into[i] += seconds * w / total


def ahead(s: int, last: int | None, L: int, B: int) -> range:
    """The positions a walk standing at ``s`` asks to have drafted: ``s``, and after a short
    last round (1-2 tokens, or none yet) the ``B/2`` positions from ``s``, where its next
    rounds likely start. A run of short rounds then takes one drafter call for several of
    them (the drafter's weights read once, not once per round) for a few blocks no round
    uses; a walk making long rounds would skip most of them, so it asks for ``s`` only."""
    short = last is None or last <= 2
    return range(s, min(s + (max(1, B // 2) if short else 1), L))


def walk_rounds(
    drafts: Drafts, budgets: list[int]
) -> tuple[list[list[int]], list[dict[str, list[int]]], list[float], list[float]]:
    """Every sequence's greedy walk and DDTree-N walks, all advanced in lockstep.

    Each step asks, for every unfinished walk, for the positions it wants (`ahead`): the
    greedy walk their acceptance, a DDTree walk their `TreeSearch` (one per position answers
    every budget, `Drafts.trees`). `Drafts.draft` drafts the blocks of both that it does not
    hold yet in shared drafter calls, then every walk moves through each round whose start
    is known, by its length ``min(a + 1, L - s)``. Returns (round lengths, {str(budget):
    round lengths}, drafter seconds, DDTree seconds) per sequence: a step's drafting
    shared by the blocks it drafted for each, its tree searches by the DDTree walks served.
    """
    seqs, B = drafts.seqs, drafts.B
    top = max(budgets, default=0)
    at = {(i, n): q.P for i, q in enumerate(seqs) for n in (0, *budgets)}  # walk 0: greedy
    out = [{n: [] for n in (0, *budgets)} for _ in seqs]
    chain_s, tree_s = [0.0] * len(seqs), [0.0] * len(seqs)
    while live := [(i, n) for (i, n), s in at.items() if s < seqs[i].L]:
        t, built = _drafts.CLOCK(), list(drafts.built)
        want: dict[int, set] = {0: set(), top: set()}
        for i, n in live:
            known = drafts.accept if n == 0 else drafts.search
            if (i, at[(i, n)]) not in known:
                last = out[i][n][-1] if out[i][n] else None
                want[0 if n == 0 else top].update(
                    (i, p) for p in ahead(at[(i, n)], last, seqs[i].L, B)
                )
        searched = drafts.draft(sorted(want[0]), sorted(want[top]), top)
        for i, n in live:
            known = drafts.accept if n == 0 else drafts.search
            while at[(i, n)] < seqs[i].L and (i, at[(i, n)]) in known:
                s = at[(i, n)]
                a = drafts.accept[(i, s)] if n == 0 else drafts.search[(i, s)].accepted(n)
                out[i][n].append(min(a + 1, seqs[i].L - s))
                at[(i, n)] += out[i][n][-1]
        for i in {i for i, _n in live}:
            drafts.forget(i, min(at[(i, n)] for n in (0, *budgets)))
        spent = _drafts.CLOCK() - t
        new = [b - a for a, b in zip(built, drafts.built, strict=True)]
        trees = [sum(i == j and n > 0 for j, n in live) for i in range(len(seqs))]
        walking = [int(any(i == j for j, _n in live)) for i in range(len(seqs))]
        _share(spent - searched, new if any(new) else walking, chain_s)
        if any(trees):
            _share(searched, trees, tree_s)
    rounds = [o.pop(0) for o in out]
    return rounds, [{str(n): r for n, r in o.items()} for o in out], chain_s, tree_s


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 16 * 2**20


def bound_heap() -> None:
    """Serve every buffer of 16 MiB or more from its own mapping, returned to the OS on
    free, and the smaller ones from the heap, kept for reuse.

    glibc otherwise raises that threshold to the largest buffer freed so far and serves
    later ones from its heap, where the target forward's, the drafter batches' and the
    head's differently sized buffers fragment it: the phases' working sets then stack up
    in the peak RSS, more so the longer the sequence, instead of taking turns. A lower
    threshold maps (and page-faults in) the walk's many small per-call buffers afresh
    on every call, which costs the drafter more CPU than its arithmetic in small calls
    (`benchmarks/eval_heap.py`). The heap's top is trimmed only past twice the
    threshold, so it is not given back and faulted in again between two calls. A no-op
    where the C library has no ``mallopt`` (musl, macOS)."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)


@torch.inference_mode()
def eval_sequence(
    target,
    drafter,
    prompt: list[int],
    completion: list[int],
    opts: WalkOptions,
    given: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """Evaluate one sample: `eval_batch` of that sample alone."""
    return eval_batch(
        target, drafter, [(prompt, completion)], opts, None if given is None else [given]
    )[0]


@torch.inference_mode()
def eval_batch(
    target,
    drafter,
    samples: list[tuple[list[int], list[int]]],
    opts: WalkOptions,
    given: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> list[dict]:
    """Evaluate ``samples`` (prompt, completion) together; returns one record per sample
    (rounds, per-position counts, DDTree rounds, agreement, timings). See the module
    docstring for the procedure. Samples walk in lockstep, so each drafter call holds a
    block of every sample still walking; a record's drafter and DDTree seconds are its
    share of those calls.

    ``given``: per sample (features [T, len(target_layer_ids)*hidden], greedy argmax from
    position P-1) computed elsewhere (another host's target, `remote.eval.parity`) instead
    of step 1's forward; the target then lends only its embedding and head."""
    bound_heap()
    seqs, base = [], []
    for n, (prompt, completion) in enumerate(samples):
        t0 = _drafts.CLOCK()
        g = list(prompt) + list(completion)
        P, L = len(prompt), len(g) - 1
        gt = torch.tensor(g, dtype=torch.long)
        if given is None:
            feats, greedy = target.forward(g, drafter.cfg.target_layer_ids, argmax_from=P - 1)
        else:
            feats, greedy = given[n]
        t_target = _drafts.CLOCK() - t0
        # Agreement: target argmax at t predicts g[t+1], for every completion token.
        agree = int((greedy[: L - P + 1] == gt[P:]).sum())
        t1 = _drafts.CLOCK()
        kv = drafter.context_kv(feats.to(drafter.fc.weight.dtype))
        del feats, greedy
        seqs.append(Seq(gt, P, kv))
        base.append({"target": t_target, "drafter": _drafts.CLOCK() - t1, "agree": agree})

    k = ddtree_k(max(opts.budgets), opts.topk, target.info.vocab_size) if opts.budgets else 0
    drafts = Drafts(drafter, target, seqs, opts.block_chunk, k)
    if opts.positions == "all":
        for i, q in enumerate(seqs):
            t = _drafts.CLOCK()
            drafts.ensure([(i, s) for s in range(q.P, q.L)])
            base[i]["drafter"] += _drafts.CLOCK() - t
    rounds, ddtree, chain_s, tree_s = walk_rounds(drafts, opts.budgets)

    B = drafter.block_size
    attempts = [[0] * (B - 1) for _ in seqs]
    hits = [[0] * (B - 1) for _ in seqs]
    drafted = [0] * len(seqs)
    for i, _s in drafts.accept:
        drafted[i] += 1
    if opts.positions == "all":  # every completion position
        counted = list(drafts.accept)
    else:  # the chain walk's round starts
        counted = [
            (i, s)
            for i, q in enumerate(seqs)
            for s in itertools.accumulate(rounds[i][:-1], initial=q.P)
            if rounds[i]
        ]
    # Per-position: depth j attempted at s when the first j-1 were right and s+j <= L.
    for i, s in counted:
        a = drafts.accept[(i, s)]
        for j in range(1, min(a + 1, B - 1, seqs[i].L - s) + 1):
            attempts[i][j - 1] += 1
            hits[i][j - 1] += j <= a
    records = []
    for i, ((_prompt, completion), q) in enumerate(zip(samples, seqs, strict=True)):
        sec = {
            "target": base[i]["target"],
            "drafter": base[i]["drafter"] + chain_s[i],
            "ddtree": tree_s[i],
        }
        records.append(
            {
                "prompt_tokens": q.P,
                "completion_tokens": len(completion),
                "rounds": rounds[i],
                "tau": (sum(rounds[i]) / len(rounds[i])) if rounds[i] else None,
                "position_attempts": attempts[i],
                "position_hits": hits[i],
                "positions_drafted": drafted[i],
                "blocks_drafted": drafts.built[i],
                "agreement": {"match": base[i]["agree"], "total": q.L - q.P + 1},
                "ddtree": ddtree[i],
                "seconds": {**sec, "total": sum(sec.values())},
            }
        )
    return records
