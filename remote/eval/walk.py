"""The offline (teacher-forced) acceptance walk (its dataset metrics: `remote.eval.metrics`).

Per sequence ``g = prompt + completion`` (``P`` prompt tokens, last index ``L``):

1. ONE target forward over ``g``: context features of every position (hooks) and the
   target's own greedy argmax (for the agreement rate).
2. Drafter context K/V once; then a drafted block at EVERY completion position
   ``s = P..L-1`` (blocks batched; or, with ``positions="walk"``, only where the walks go),
   giving ``a_s`` = leading draft tokens equal to ``g[s+1..]`` (capped at ``L``). The last
   drafter layer and the head run depth by depth, only for blocks still matching: about
   tau rows per block instead of ``B`` (`remote.eval.drafter.Blocks`).
3. The walk, exactly as greedy online decoding: ``s = P``; round length
   ``min(a_s + 1, L - s)``; ``s += length``; stop at ``L``. (The first completion token
   comes from the target's prefill, as in z-lab's loop, and is not a round.) Blocks are
   always ``B`` long, as in a generation that ends on EOS.
4. DDTree-N walks the same way with tree acceptance, from per-depth top-k log-probs of the
   drafter at the positions that walk visits. One `remote.eval.ddtree.TreeSearch` per
   visited position answers every budget at once (a smaller budget's tree is the first
   nodes of the largest one's), and asks for a depth's row only when the best-first order
   reaches it or the ground truth is still in the tree: the rows step 2 computed are
   reused, and a drafter that misses at depth 1 costs no more rows. The walks of all
   budgets advance in lockstep, computing what they need in shared batches.

Memory stays flat in the sequence length: drafter blocks, attention scores and head logits
go in batches of bounded bytes, DDTree keeps top-k rows (not logits) only for positions a
walk can still visit, and large buffers go back to the OS when freed (`bound_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from dataclasses import dataclass, field

import torch

from remote.eval.ddtree import TreeSearch

# The metrics live in a torch-free module shared with the orchestrator's shard merge;
# re-exported here for callers that know them from this module.
from remote.eval.metrics import ddtree_k, summarize  # noqa: F401
from remote.eval.target import greedy_tokens


@dataclass
class WalkOptions:
    """``budgets``: DDTree node budgets; ``topk``: per-depth candidates (None = the budget);
    ``block_chunk``: blocks per batched drafter call (memory vs speed; None = as many as
    `auto_chunk` allows); ``positions``:
    ``"all"`` drafts a block at every completion position (per-position acceptance over all
    of them, as docs/dflash-eval.md asks) or ``"walk"`` drafts only where the walks go
    (per-position acceptance then covers walk positions only). "walk" drafts about tau
    times fewer blocks but one at a time; it pays only for drafters with several layers,
    whose layers before the last run on every row of every block."""

    budgets: list[int] = field(default_factory=list)
    topk: int | None = None
    block_chunk: int | None = None
    positions: str = "all"


SCORES_BYTES = 16 * 2**20  # attention scores of one batched drafter call, at most


def auto_chunk(cfg, context: int, budget: int = SCORES_BYTES) -> int:
    """Blocks per batched drafter call: as many as keep the float32 attention scores (with
    their softmax temporaries) under ``budget`` bytes, 16..1024. Larger batches read the
    weights fewer times; layers before the last hold ``B`` query rows per block, the last
    one a single row per block and depth. The bound keeps the working set flat as the
    context grows (a long completion takes more calls, not more memory)."""
    rows = cfg.block_size if cfg.num_layers > 1 else 1
    per_block = 3 * 4 * rows * cfg.num_heads * (context + cfg.block_size)
    return max(16, min(1024, budget // per_block))


class Drafts:
    """Drafted blocks of one sequence, computed on demand in batches and kept by start.

    ``accept[s]``: leading draft tokens of the block at ``s`` equal to ``g[s+1..]`` (capped
    at ``L``); only the rows that number needs are computed (`remote.eval.drafter.Blocks`).
    ``rows[s]``: with ``k`` > 0 (DDTree), the top-``k`` (log-probs, tokens) of the block at
    ``s``'s depths ``1, 2, ...`` computed so far: every row the acceptance walk computes is
    kept, and `trees` adds deeper ones only where a tree search asks for them.
    ``search[s]``: the finished `TreeSearch` at ``s`` (acceptance of every budget).
    """

    HEAD_BYTES = 8 * 2**20  # float32 logits of one head call, at most (HEAD_ROWS at least)
    HEAD_ROWS = 64  # rows per head call at least: a huge vocabulary still reuses its weights

    def __init__(self, drafter, target, kv, g: torch.Tensor, P: int, chunk: int | None, k: int = 0):
        self.drafter, self.target, self.kv, self.g = drafter, target, kv, g
        self.P, self.L, self.B = P, len(g) - 1, drafter.block_size
        self.chunk = chunk or auto_chunk(drafter.cfg, self.L)
        self.k = k
        self.head_rows = self.rows_per_head(target.lm_head.shape[0])
        self.accept: dict[int, int] = {}
        self.rows: dict[int, list[tuple[list[float], list[int]]]] = {}
        self.search: dict[int, TreeSearch] = {}
        self.kept_from = P  # `forget` dropped every start before this one

    @classmethod
    def rows_per_head(cls, vocab: int) -> int:
        """Rows per head call: float32 logits within HEAD_BYTES, HEAD_ROWS at least."""
        return max(cls.HEAD_ROWS, cls.HEAD_BYTES // (4 * vocab))

    def head(self, h: torch.Tensor, starts: list[int], depths: list[int]) -> torch.Tensor:
        """Greedy tokens of final hidden rows ``h`` (row ``i``: depth ``depths[i]`` of the
        block at ``starts[i]``), the head run ``head_rows`` rows at a time; with ``k``, each
        row's top-k log-probs become ``rows[s][depth - 1]`` (unless known already)."""
        preds = []
        for c in range(0, h.shape[0], self.head_rows):
            logits = self.drafter.logits(h[c : c + self.head_rows], self.target.lm_head)
            preds.append(greedy_tokens(logits))
            if self.k:
                logp = torch.log_softmax(logits.float(), dim=-1)
                del logits
                v, i = torch.topk(logp, self.k, dim=-1)
                del logp
                at = slice(c, c + self.head_rows)
                got = zip(starts[at], depths[at], v.tolist(), i.tolist(), strict=True)
                for s, d, vr, ir in got:
                    have = self.rows.setdefault(s, [])
                    if len(have) == d - 1:
                        have.append((vr, ir))
        return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)

    def ensure(self, starts: list[int]) -> None:
        """Compute ``accept`` for ``starts`` (those not known yet), ``chunk`` blocks at a time."""
        todo = [s for s in starts if s not in self.accept]
        for c in range(0, len(todo), self.chunk):
            st = torch.tensor(todo[c : c + self.chunk])
            blocks = self.drafter.blocks(self.kv, st, self.g[st], self.target.embed)
            acc = torch.zeros(len(st), dtype=torch.long)
            alive = torch.arange(len(st))
            for j in range(1, self.B):  # rows (and head rows) only for blocks still matching
                alive = alive[st[alive] + j <= self.L]
                if len(alive) == 0:
                    break
                pred = self.head(
                    blocks.hidden(alive * self.B + j), st[alive].tolist(), [j] * len(alive)
                )
                alive = alive[pred == self.g[st[alive] + j]]
                acc[alive] += 1
            for i, s in enumerate(st.tolist()):
                self.accept[s] = int(acc[i])

    def trees(self, starts: list[int], budget: int) -> None:
        """Run the `TreeSearch` of ``budget`` at ``starts`` (those not searched yet), ``chunk``
        blocks at a time: each round computes, in one batch, the next depth row of every
        search that asks for one beyond ``rows``."""
        todo = [s for s in starts if s not in self.search]
        for c in range(0, len(todo), self.chunk):
            group = todo[c : c + self.chunk]
            pending = {
                s: TreeSearch(self.g[s + 1 : s + 1 + min(self.B - 1, self.L - s)].tolist(), budget)
                for s in group
            }
            self.search.update(pending)
            built: dict[int, tuple[object, int]] = {}  # start -> (its Blocks, index there)
            while pending:
                asks = []
                for s, search in list(pending.items()):
                    have = self.rows.setdefault(s, [])
                    while (d := search.need()) is not None and d <= len(have):
                        search.feed(*have[d - 1])
                    if d is None:
                        del pending[s]
                    else:
                        asks.append(s)
                if asks:
                    self._next_rows(asks, built)

    def _next_rows(self, starts: list[int], built: dict) -> None:
        """Append the next depth row to ``rows[s]`` for each of ``starts``, building the
        blocks not built yet (kept in ``built`` for the search's later rounds)."""
        new = [s for s in starts if s not in built]
        if new:
            st = torch.tensor(new)
            blocks = self.drafter.blocks(self.kv, st, self.g[st], self.target.embed)
            built.update((s, (blocks, b)) for b, s in enumerate(new))
        by_blocks: dict[int, tuple[object, list[int]]] = {}
        for s in starts:
            blocks, _b = built[s]
            by_blocks.setdefault(id(blocks), (blocks, []))[1].append(s)
        for blocks, group in by_blocks.values():
            depths = [len(self.rows[s]) + 1 for s in group]
            index = [built[s][1] for s in group]
            flat = torch.tensor(index) * self.B + torch.tensor(depths)
            self.head(blocks.hidden(flat), group, depths)

    def forget(self, below: int) -> None:
        """Drop the rows and searches of starts before ``below`` (no walk returns there)."""
        for s in range(self.kept_from, below):
            self.rows.pop(s, None)
            self.search.pop(s, None)
        self.kept_from = max(self.kept_from, below)


def ddtree_rounds(drafts: Drafts, budgets: list[int]) -> dict[str, list[int]]:
    """DDTree-N round lengths for every budget, the walks advanced in lockstep.

    One `TreeSearch` per visited position answers every budget (`Drafts.trees`). Each step
    searches, in shared batches, the positions every unfinished walk needs next. A walk
    whose last round was short (1-2 tokens) also asks for the ``B/2`` positions after it,
    where its next rounds will likely land; a walk making long rounds would skip most of
    them, so it asks for its next position only.
    """
    P, L, B = drafts.P, drafts.L, drafts.B
    top = max(budgets)
    at = {n: P for n in budgets}
    out: dict[str, list[int]] = {str(n): [] for n in budgets}
    while True:
        live = [n for n in budgets if at[n] < L]
        if not live:
            return out
        if any(at[n] not in drafts.search for n in live):
            want = set()
            for n in live:
                short = not out[str(n)] or out[str(n)][-1] <= 2
                want.update(range(at[n], min(at[n] + (max(1, B // 2) if short else 1), L)))
            drafts.trees(sorted(want), top)
        for n in live:
            s = at[n]
            a = drafts.search[s].accepted(n)
            out[str(n)].append(min(a + 1, L - s))
            at[n] += out[str(n)][-1]
        drafts.forget(min(at.values()))


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 2**20


def bound_heap() -> None:
    """Serve every buffer of 1 MiB or more from its own mapping, returned to the OS on free.

    glibc otherwise raises that threshold to the largest buffer freed so far and serves
    later ones from its heap, where the target forward's, the drafter batches' and the
    head's differently sized buffers fragment it: the phases' working sets then stack up
    in the peak RSS, more so the longer the sequence, instead of taking turns. A no-op
    where the C library has no ``mallopt`` (musl, macOS)."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


@torch.inference_mode()
def eval_sequence(
    target,
    drafter,
    prompt: list[int],
    completion: list[int],
    opts: WalkOptions,
    given: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """Evaluate one sample; returns its record (rounds, per-position counts, DDTree rounds,
    agreement, timings). See the module docstring for the procedure.

    ``given``: (features [T, len(target_layer_ids)*hidden], greedy argmax from position
    P-1) computed elsewhere (another host's target, `remote.eval.parity`) instead of step 1's
    forward; the target then lends only its embedding and head."""
    bound_heap()
    t0 = time.perf_counter()
    g = list(prompt) + list(completion)
    P, L, B = len(prompt), len(g) - 1, drafter.block_size
    gt = torch.tensor(g, dtype=torch.long)
    if given is None:
        feats, greedy = target.forward(g, drafter.cfg.target_layer_ids, argmax_from=P - 1)
    else:
        feats, greedy = given
    t_target = time.perf_counter() - t0

    # Agreement: target argmax at t predicts g[t+1], for every completion token.
    agree = int((greedy[: L - P + 1] == gt[P:]).sum())

    t1 = time.perf_counter()
    kv = drafter.context_kv(feats.to(drafter.fc.weight.dtype))
    del feats
    k = ddtree_k(max(opts.budgets), opts.topk, target.info.vocab_size) if opts.budgets else 0
    drafts = Drafts(drafter, target, kv, gt, P, opts.block_chunk, k)
    if opts.positions == "all":
        drafts.ensure(list(range(P, L)))

    rounds, s = [], P
    while s < L:
        drafts.ensure([s])
        n = min(drafts.accept[s] + 1, L - s)
        rounds.append(n)
        s += n
    t_draft = time.perf_counter() - t1

    t2 = time.perf_counter()
    ddtree = ddtree_rounds(drafts, opts.budgets) if opts.budgets else {}
    t_tree = time.perf_counter() - t2

    # Per-position: depth j attempted at s when the first j-1 were right and s+j <= L.
    attempts, hits = [0] * (B - 1), [0] * (B - 1)
    for s, a in drafts.accept.items():
        for j in range(1, min(a + 1, B - 1, L - s) + 1):
            attempts[j - 1] += 1
            hits[j - 1] += j <= a

    return {
        "prompt_tokens": P,
        "completion_tokens": len(completion),
        "rounds": rounds,
        "tau": (sum(rounds) / len(rounds)) if rounds else None,
        "position_attempts": attempts,
        "position_hits": hits,
        "positions_drafted": len(drafts.accept),
        "agreement": {"match": agree, "total": L - P + 1},
        "ddtree": ddtree,
        "seconds": {
            "target": t_target,
            "drafter": t_draft,
            "ddtree": t_tree,
            "total": time.perf_counter() - t0,
        },
    }
