"""The offline (teacher-forced) acceptance walk (its dataset metrics: `remote.metrics`).

Per sequence ``g = prompt + completion`` (``P`` prompt tokens, last index ``L``):

1. ONE target forward over ``g``: context features of every position (hooks) and the
   target's own greedy argmax (for the agreement rate).
2. Drafter context K/V once; then a drafted block at EVERY completion position
   ``s = P..L-1`` (blocks batched; or, with ``positions="walk"``, only where the walks go),
   giving ``a_s`` = leading draft tokens equal to ``g[s+1..]`` (capped at ``L``). Head rows
   are computed depth by depth only for blocks still matching, so a large vocabulary is paid
   for where it matters.
3. The walk, exactly as greedy online decoding: ``s = P``; round length
   ``min(a_s + 1, L - s)``; ``s += length``; stop at ``L``. (The first completion token
   comes from the target's prefill, as in z-lab's loop, and is not a round.) Blocks are
   always ``B`` long, as in a generation that ends on EOS.
4. DDTree-N walks the same way with tree acceptance, from per-depth top-k log-probs of the
   drafter at the positions that walk visits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from remote.ddtree import ddtree_accept
# The metrics live in a torch-free module shared with the orchestrator's shard merge;
# re-exported here for callers that know them from this module.
from remote.metrics import ddtree_k, summarize  # noqa: F401


@dataclass
class WalkOptions:
    """``budgets``: DDTree node budgets; ``topk``: per-depth candidates (None = the budget);
    ``block_chunk``: blocks per batched drafter call (memory vs speed); ``positions``:
    ``"all"`` drafts a block at every completion position (per-position acceptance over all
    of them, as dflash-eval.md asks) or ``"walk"`` drafts only where the walks go (cheaper by
    about tau; per-position acceptance then covers walk positions only)."""

    budgets: list[int] = field(default_factory=list)
    topk: int | None = None
    block_chunk: int = 64
    positions: str = "all"


class Drafts:
    """Drafted blocks of one sequence, computed on demand in batches and kept by start.

    For each start ``s`` it records ``a_s`` (leading draft tokens equal to ``g[s+1..]``,
    capped at ``L``) and, when DDTree needs them, the final hidden rows 1..B-1.
    """

    def __init__(self, drafter, target, kv, g: torch.Tensor, P: int, keep_hidden: bool, chunk: int):
        self.drafter, self.target, self.kv, self.g = drafter, target, kv, g
        self.P, self.L, self.B = P, len(g) - 1, drafter.block_size
        self.keep_hidden, self.chunk = keep_hidden, chunk
        self.accept: dict[int, int] = {}
        self.hidden: dict[int, torch.Tensor] = {}

    def ensure(self, starts: list[int]) -> None:
        todo = [s for s in starts if s not in self.accept]
        for c in range(0, len(todo), self.chunk):
            st = torch.tensor(todo[c:c + self.chunk])
            h = self.drafter.forward_blocks(self.kv, st, self.drafter.block_inputs(self.target.embed, self.g[st]))
            acc = torch.zeros(len(st), dtype=torch.long)
            alive = torch.arange(len(st))
            for j in range(1, self.B):  # head rows only for blocks still matching
                alive = alive[st[alive] + j <= self.L]
                if len(alive) == 0:
                    break
                pred = torch.argmax(self.drafter.logits(h[alive, j], self.target.lm_head).float(), dim=-1)
                alive = alive[pred == self.g[st[alive] + j]]
                acc[alive] += 1
            for i, s in enumerate(st.tolist()):
                self.accept[s] = int(acc[i])
                if self.keep_hidden:
                    self.hidden[s] = h[i, 1:]

    def topk(self, s: int, k: int) -> tuple[list, list]:
        """Per-depth top-``k`` (log-probs, tokens) of the block at ``s``, depths 1..min(B-1, L-s)."""
        self.ensure([s])
        depth = min(self.B - 1, self.L - s)
        logits = self.drafter.logits(self.hidden[s][:depth], self.target.lm_head).float()
        v, i = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
        return v.tolist(), i.tolist()


@torch.inference_mode()
def eval_sequence(target, drafter, prompt: list[int], completion: list[int], opts: WalkOptions) -> dict:
    """Evaluate one sample; returns its record (rounds, per-position counts, DDTree rounds,
    agreement, timings). See the module docstring for the procedure."""
    t0 = time.perf_counter()
    g = list(prompt) + list(completion)
    P, L, B = len(prompt), len(g) - 1, drafter.block_size
    gt = torch.tensor(g, dtype=torch.long)
    feats, greedy = target.forward(g, drafter.cfg.target_layer_ids, argmax_from=P - 1)
    t_target = time.perf_counter() - t0

    # Agreement: target argmax at t predicts g[t+1], for every completion token.
    agree = int((greedy[: L - P + 1] == gt[P:]).sum())

    t1 = time.perf_counter()
    kv = drafter.context_kv(feats.to(drafter.fc.weight.dtype))
    del feats
    drafts = Drafts(drafter, target, kv, gt, P, bool(opts.budgets), opts.block_chunk)
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
    ddtree: dict[str, list[int]] = {}
    if opts.budgets:
        k_max = max(ddtree_k(n, opts.topk, target.info.vocab_size) for n in opts.budgets)
        cache: dict[int, tuple[list, list]] = {}
        for n in opts.budgets:
            k = ddtree_k(n, opts.topk, target.info.vocab_size)
            out, s = [], P
            while s < L:
                if s not in cache:
                    cache[s] = drafts.topk(s, k_max)
                v, i = cache[s]
                a = ddtree_accept([r[:k] for r in v], [r[:k] for r in i], g[s + 1: s + 1 + len(v)], n)
                out.append(min(a + 1, L - s))
                s += out[-1]
            ddtree[str(n)] = out
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
        "seconds": {"target": t_target, "drafter": t_draft, "ddtree": t_tree, "total": time.perf_counter() - t0},
    }
