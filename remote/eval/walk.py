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
   drafter at the positions that walk visits (every row of those blocks and the full head:
   the tree competes across depths, so nothing can be skipped). The walks of all budgets
   advance in lockstep, computing what they need in shared batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from remote.eval.ddtree import ddtree_accept

# The metrics live in a torch-free module shared with the orchestrator's shard merge;
# re-exported here for callers that know them from this module.
from remote.eval.metrics import ddtree_k, summarize  # noqa: F401


@dataclass
class WalkOptions:
    """``budgets``: DDTree node budgets; ``topk``: per-depth candidates (None = the budget);
    ``block_chunk``: blocks per batched drafter call (memory vs speed; None = as many as
    `auto_chunk` allows); ``positions``:
    ``"all"`` drafts a block at every completion position (per-position acceptance over all
    of them, as dflash-eval.md asks) or ``"walk"`` drafts only where the walks go
    (per-position acceptance then covers walk positions only). "walk" drafts about tau
    times fewer blocks but one at a time; it pays only for drafters with several layers,
    whose layers before the last run on every row of every block."""

    budgets: list[int] = field(default_factory=list)
    topk: int | None = None
    block_chunk: int | None = None
    positions: str = "all"


SCORES_BYTES = 256 * 2**20  # attention scores of one batched drafter call, at most


def auto_chunk(cfg, context: int, budget: int = SCORES_BYTES) -> int:
    """Blocks per batched drafter call: as many as keep the float32 attention scores (with
    their softmax temporaries) under ``budget`` bytes, 16..1024. Larger batches read the
    weights fewer times; layers before the last hold ``B`` query rows per block, the last
    one a single row per block and depth."""
    rows = cfg.block_size if cfg.num_layers > 1 else 1
    per_block = 3 * 4 * rows * cfg.num_heads * (context + cfg.block_size)
    return max(16, min(1024, budget // per_block))


class Drafts:
    """Drafted blocks of one sequence, computed on demand in batches and kept by start.

    ``accept[s]``: leading draft tokens of the block at ``s`` equal to ``g[s+1..]`` (capped
    at ``L``); only the rows that number needs are computed (`remote.eval.drafter.Blocks`).
    ``tree[s]``: per-depth top-k (log-probs, tokens) of the block at ``s`` for DDTree, which
    needs every row of the block and the full head.
    """

    HEAD_BYTES = 128 * 2**20  # float32 logits held at once when taking DDTree's top-k

    def __init__(self, drafter, target, kv, g: torch.Tensor, P: int, chunk: int | None):
        self.drafter, self.target, self.kv, self.g = drafter, target, kv, g
        self.P, self.L, self.B = P, len(g) - 1, drafter.block_size
        self.chunk = chunk or auto_chunk(drafter.cfg, self.L)
        self.accept: dict[int, int] = {}
        self.tree: dict[int, tuple[list, list]] = {}

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
                h = blocks.hidden(alive * self.B + j)
                pred = torch.argmax(self.drafter.logits(h, self.target.lm_head).float(), dim=-1)
                alive = alive[pred == self.g[st[alive] + j]]
                acc[alive] += 1
            for i, s in enumerate(st.tolist()):
                self.accept[s] = int(acc[i])

    def ensure_tree(self, starts: list[int], k: int) -> None:
        """Compute ``tree`` (top-``k`` per depth 1..min(B-1, L-s)) for ``starts`` in batches."""
        todo = [s for s in starts if s not in self.tree]
        vocab = self.target.lm_head.shape[0]
        per_chunk = max(1, min(self.chunk, self.HEAD_BYTES // (4 * vocab * (self.B - 1))))
        for c in range(0, len(todo), per_chunk):
            st = torch.tensor(todo[c : c + per_chunk])
            h = self.drafter.blocks(self.kv, st, self.g[st], self.target.embed).hidden()[:, 1:]
            logp = torch.log_softmax(self.drafter.logits(h, self.target.lm_head).float(), dim=-1)
            v, i = torch.topk(logp, k, dim=-1)
            for b, s in enumerate(st.tolist()):
                depth = min(self.B - 1, self.L - s)
                self.tree[s] = (v[b, :depth].tolist(), i[b, :depth].tolist())


def ddtree_rounds(
    drafts: Drafts, g: list[int], budgets: list[int], topk: int | None, vocab: int
) -> dict[str, list[int]]:
    """DDTree-N round lengths for every budget, the walks advanced in lockstep.

    Each step computes, in one batch, the blocks every unfinished walk needs next: the
    drafter's weights and head are read once per step, not once per round and budget. A
    walk whose last round was short (1-2 tokens) also asks for the ``B/2`` positions after
    it, where its next rounds will likely land; a walk making long rounds would skip most
    of them, so it asks for its next position only.
    """
    P, L, B = drafts.P, drafts.L, drafts.B
    ks = {n: ddtree_k(n, topk, vocab) for n in budgets}
    k_max = max(ks.values())
    at = {n: P for n in budgets}
    out: dict[str, list[int]] = {str(n): [] for n in budgets}
    while True:
        live = [n for n in budgets if at[n] < L]
        if not live:
            return out
        if any(at[n] not in drafts.tree for n in live):
            want = set()
            for n in live:
                short = not out[str(n)] or out[str(n)][-1] <= 2
                want.update(range(at[n], min(at[n] + (max(1, B // 2) if short else 1), L)))
            drafts.ensure_tree(sorted(want), k_max)
        for n in live:
            s, k = at[n], ks[n]
            v, i = drafts.tree[s]
            a = ddtree_accept([r[:k] for r in v], [r[:k] for r in i], g[s + 1 : s + 1 + len(v)], n)
            out[str(n)].append(min(a + 1, L - s))
            at[n] += out[str(n)][-1]


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
    drafts = Drafts(drafter, target, kv, gt, P, opts.block_chunk)
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
    ddtree = (
        ddtree_rounds(drafts, g, opts.budgets, opts.topk, target.info.vocab_size)
        if opts.budgets
        else {}
    )
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
