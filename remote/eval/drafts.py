"""Drafted blocks of the samples walking together (`Drafts`), computed on demand in
batches of bounded bytes (`auto_chunk`) and kept by ``(sample, block start)``: what the
walks of `remote.eval.walk` ask for, each step's blocks of every sample in one drafter call.

torch is imported at module import: import this module lazily.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from remote.eval.ddtree import TreeSearch
from remote.eval.target import greedy_tokens

SCORES_BYTES = 16 * 2**20  # attention scores of one batched drafter call, at most
# The clock of the records' drafter and DDTree seconds (a benchmark on a shared machine
# may set time.process_time: wall time there moves with other processes' load).
CLOCK = time.perf_counter
KEPT_BYTES = 64 * 2**20  # drafted blocks' last-layer inputs kept for later tree searches, at most


def auto_chunk(cfg, context: int, budget: int = SCORES_BYTES) -> int:
    """Blocks per batched drafter call: as many as keep the float32 attention scores (with
    their softmax temporaries) under ``budget`` bytes, 16..1024. Larger batches read the
    weights fewer times; layers before the last hold ``B`` query rows per block, the last
    one a single row per block and depth. The bound keeps the working set flat as the
    context grows (a long completion takes more calls, not more memory); past
    `CONTEXT_CHUNK` positions the attention takes the context a chunk at a time."""
    from remote.eval.drafter_layers import CONTEXT_CHUNK

    rows = cfg.block_size if cfg.num_layers > 1 else 1
    per_block = 3 * 4 * rows * cfg.num_heads * (min(context, CONTEXT_CHUNK) + cfg.block_size)
    return max(16, min(1024, budget // per_block))


@dataclass
class Seq:
    """One sample as the drafter sees it: ``g`` = prompt + completion token ids, ``P`` the
    prompt's length, ``kv`` the drafter's context K/V over ``g``'s target features."""

    g: torch.Tensor
    P: int
    kv: list

    @property
    def L(self) -> int:  # the walk's own name for the last index
        return len(self.g) - 1


Key = tuple[int, int]  # (sequence index, block start)


class Drafts:
    """Drafted blocks of one or more sequences, computed on demand in batches and kept by
    ``(sequence, start)``; blocks of several sequences share each drafter call.

    ``accept[key]``: leading draft tokens of the block at ``key`` equal to ``g[s+1..]``
    (capped at ``L``); only the rows that number needs are computed
    (`remote.eval.drafter_model.Blocks`). ``rows[key]``: with ``k`` > 0 (DDTree), the top-``k``
    (log-probs, tokens) of the block's depths ``1, 2, ...`` computed so far: every row the
    acceptance walk computes is kept, and `trees` adds deeper ones only where a tree
    search asks for them. ``search[key]``: the finished `TreeSearch` there (acceptance of
    every budget). ``built[i]``: blocks drafted for sequence ``i`` so far.

    With ``k`` > 0 a drafted block's last-layer inputs stay (``kept``, `_build`) until
    `forget` passes its start or newer ones push it out (the batches kept keys hold stay
    within KEPT_BYTES), so a tree search at a block the chain walk drafted (or a chain walk
    at a block a tree search drafted) asks the last layer for more rows instead of drafting
    the block again. Rows of blocks drafted in different calls go through the last layer
    and the head together (`remote.eval.drafter_model.Blocks.joined`).

    Sequences join with `add` while others walk and leave with `release` once their
    record is made, dropping their context K/V and everything kept of theirs.
    """

    HEAD_BYTES = 8 * 2**20  # float32 logits of one head call, at most (HEAD_ROWS at least)
    HEAD_ROWS = 64  # rows per head call at least: a huge vocabulary still reuses its weights

    def __init__(
        self,
        drafter,
        target,
        seqs: list[Seq],
        chunk: int | None,
        k: int = 0,
        longest: int | None = None,
    ):
        self.drafter, self.target = drafter, target
        self.B = drafter.block_size
        # ``longest``: the last index of the longest sequence to come (`add`), when the
        # sequences join while others walk
        self.chunk = chunk or auto_chunk(drafter.cfg, longest or max(q.L for q in seqs))
        self.k = k
        self.head_rows = self.rows_per_head(target.lm_head.shape[0])
        self.seqs: list[Seq | None] = []  # by index; None once `release` dropped it
        self.live: dict[int, Seq] = {}
        self.last = torch.zeros(0, dtype=torch.long)
        self.accept: dict[Key, int] = {}
        self.rows: dict[Key, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.search: dict[Key, TreeSearch] = {}
        self.kept_from: list[int] = []  # `forget` dropped every start before these
        self.built: list[int] = []
        self.kept: dict[Key, tuple[object, int]] = {}  # key -> (its Blocks, index there)
        self.held: dict[int, list[int]] = {}  # id(Blocks) -> [its bytes, keys kept of it]
        self.kept_bytes = 0  # of the Blocks that kept keys hold
        for q in seqs:
            self.add(q)

    def add(self, q: Seq) -> int:
        """Take sequence ``q`` in (its blocks then share the calls of the others'); returns
        its index, the first of the keys ``(index, start)`` of its blocks."""
        i = len(self.seqs)
        self.seqs.append(q)
        self.live[i] = q
        self.kept_from.append(q.P)
        self.built.append(0)
        self.last = torch.cat((self.last, torch.tensor([q.L])))
        self._index()
        return i

    def release(self, i: int) -> None:
        """Drop everything sequence ``i`` holds, its context K/V and ``accept`` with the
        rest (its walks have ended and its record is made)."""
        self.forget(i, self.seqs[i].L + 1)
        for key in [key for key in self.accept if key[0] == i]:
            del self.accept[key]
        self.seqs[i] = None
        del self.live[i]
        self._index()

    def _index(self) -> None:
        # the live sequences' tokens end to end, so a batch's ground truth is one gather
        ids = torch.tensor(list(self.live), dtype=torch.long)
        lens = torch.tensor([len(q.g) for q in self.live.values()], dtype=torch.long)
        self.flat = torch.cat([q.g for q in self.live.values()]) if self.live else self.last[:0]
        self.offset = torch.zeros(len(self.seqs), dtype=torch.long)
        self.offset[ids] = lens.cumsum(0) - lens

    @classmethod
    def rows_per_head(cls, vocab: int) -> int:
        """Rows per head call: float32 logits within HEAD_BYTES, HEAD_ROWS at least."""
        return max(cls.HEAD_ROWS, cls.HEAD_BYTES // (4 * vocab))

    def head(self, h: torch.Tensor, keys: list[Key], depths: list[int]) -> torch.Tensor:
        """Greedy tokens of final hidden rows ``h`` (row ``i``: depth ``depths[i]`` of the
        block at ``keys[i]``), the head run ``head_rows`` rows at a time; with ``k``, each
        row's top-k log-probs become ``rows[key][depth - 1]`` (unless known already)."""
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
                # rows stay tensors (a few bytes per candidate, not a Python object each)
                got = zip(keys[at], depths[at], v.unbind(), i.unbind(), strict=True)
                for key, d, vr, ir in got:
                    have = self.rows.setdefault(key, [])
                    if len(have) == d - 1:
                        have.append((vr, ir))
        return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)

    def _build(self, keys: list[Key]):
        """The drafter's blocks at ``keys`` (sorted), in one call: (Blocks, sequence of each
        block, starts)."""
        seq = torch.tensor([i for i, _s in keys])
        st = torch.tensor([s for _i, s in keys])
        first = self.flat[self.offset[seq] + st]
        kvs = [None if q is None else q.kv for q in self.seqs]
        blocks = self.drafter.blocks(kvs, st, first, self.target.embed, seq=seq)
        for b, (i, s) in enumerate(keys):
            self.built[i] += 1
            if self.k and s >= self.kept_from[i]:
                self._keep((i, s), blocks, b)
        while self.kept_bytes > KEPT_BYTES:  # the oldest go; drafting again is exact
            self._drop(next(iter(self.kept)))
        return blocks, seq, st

    def _keep(self, key: Key, blocks, b: int) -> None:
        self._drop(key)
        held = self.held.setdefault(id(blocks), [blocks.nbytes, 0])
        self.kept_bytes += held[0] if held[1] == 0 else 0
        held[1] += 1
        self.kept[key] = (blocks, b)

    def _drop(self, key: Key) -> None:
        if (got := self.kept.pop(key, None)) is not None:
            held = self.held[id(got[0])]
            held[1] -= 1
            if held[1] == 0:  # no key holds that batch any more: its memory goes
                self.kept_bytes -= held[0]
                del self.held[id(got[0])]

    def _located(self, keys: list[Key]) -> dict[Key, tuple[object, int]]:
        """(Blocks, index there) of each of ``keys`` (sorted, unique): the kept ones as they
        are, the others drafted now, ``chunk`` blocks per drafter call."""
        where = {key: self.kept[key] for key in keys if key in self.kept}
        new = [key for key in keys if key not in where]
        for c in range(0, len(new), self.chunk):
            part = new[c : c + self.chunk]
            blocks, _seq, _st = self._build(part)
            where.update((key, (blocks, b)) for b, key in enumerate(part))
        return where

    def draft(self, chain: list[Key], trees: list[Key], budget: int) -> float:
        """One lockstep step of every walk: ``accept`` at ``chain`` and the `TreeSearch` of
        ``budget`` at ``trees`` (those not known yet), the blocks of both that are not kept
        drafted together, ``chunk`` blocks per drafter call. Returns the seconds the tree
        searches took (their rows beyond the blocks' drafting)."""
        todo = sorted({key for key in chain if key not in self.accept})
        search = sorted({key for key in trees if key not in self.search})
        where = self._located(sorted(set(todo) | set(search)))
        if todo:
            self._accept(*self._joined(todo, where), todo)
        t = CLOCK()
        if search:
            self._search(search, budget, where)
        return CLOCK() - t

    def _truth(self, seq: torch.Tensor, st: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``g[s+j]`` of the blocks at (seq, st) for ``j = 0..B-1``, whether ``s+j <= L``)."""
        at = st[:, None] + torch.arange(self.B)[None, :]
        ok = at <= self.last[seq][:, None]
        index = self.offset[seq][:, None] + torch.minimum(at, self.last[seq][:, None])
        return self.flat[index], ok

    def ensure(self, keys: list[Key]) -> None:
        """Compute ``accept`` for ``keys`` (those not known yet), ``chunk`` blocks at a time."""
        todo = sorted({key for key in keys if key not in self.accept})
        for c in range(0, len(todo), self.chunk):
            part = todo[c : c + self.chunk]
            blocks, _seq, _st = self._build(part)
            self._accept(blocks, torch.arange(len(part)), part)

    @staticmethod
    def _joined(keys: list[Key], where: dict) -> tuple[object, torch.Tensor]:
        """(one Blocks holding the blocks at ``keys``, which `where` locates, the index of
        each there): blocks drafted in different calls answer one `Blocks.hidden` call."""
        from remote.eval.drafter_model import Blocks  # transformers: only when drafting

        parts: dict[int, tuple[object, dict[int, int]]] = {}
        for key in keys:
            blocks, b = where[key]
            parts.setdefault(id(blocks), (blocks, {}))[1].setdefault(b, 0)
        at, index = 0, {}
        for pid, (_blocks, picks) in parts.items():
            for b in picks:
                index[(pid, b)] = at
                at += 1
        joined = Blocks.joined([(blocks, list(picks)) for blocks, picks in parts.values()])
        return joined, torch.tensor([index[(id(where[key][0]), where[key][1])] for key in keys])

    def _accept(self, blocks, index: torch.Tensor, part: list[Key]) -> None:
        """``accept`` of the blocks at ``part``, block ``index[b]`` of ``blocks`` each."""
        seq = torch.tensor([i for i, _s in part])
        st = torch.tensor([s for _i, s in part])
        truth, ok = self._truth(seq, st)
        acc = torch.zeros(len(part), dtype=torch.long)
        alive, j, width = torch.arange(len(part)), 1, 1
        while j < self.B and len(alive):  # rows only for blocks still matching
            # Each pass reads the last layer's and the head's weights again: blocks that
            # keep matching take twice the depths in each next pass (1, 2, 4, ...), at
            # most as many rows again as they need.
            w, width = min(self.B - j, width), 2 * width
            blk = alive[:, None].expand(-1, w)
            depth = torch.arange(j, j + w)[None, :].expand(len(alive), -1)
            have = ok[blk, depth]  # s + depth <= L
            pred = torch.full(have.shape, -1, dtype=torch.long)
            if not bool(have.any()):  # every block still matching reached L
                break
            hid = blocks.depths(index[alive], j, w)  # [alive, w, hidden]
            pred[have] = self.head(
                hid[have], [part[b] for b in blk[have].tolist()], depth[have].tolist()
            )
            right = (pred == truth[blk, depth]) & have
            run = right.long().cumprod(1).sum(1)  # leading right depths in the window
            acc[alive] += run
            alive, j = alive[run == w], j + w
        self.accept.update(zip(part, acc.tolist(), strict=True))

    def trees(self, keys: list[Key], budget: int) -> None:
        """Run the `TreeSearch` of ``budget`` at ``keys`` (those not searched yet), ``chunk``
        blocks at a time: each round computes, in one batch, the next depth row of every
        search that asks for one beyond ``rows``."""
        todo = sorted({key for key in keys if key not in self.search})
        for c in range(0, len(todo), self.chunk):
            self._search(todo[c : c + self.chunk], budget, {})

    def _search(self, group: list[Key], budget: int, where: dict) -> None:
        """The searches at ``group`` (not searched yet); ``where``: (Blocks, index) of
        blocks at hand (`_located`), the kept ones and those drafted on demand besides."""
        pending = {}
        for i, s in group:
            g, L = self.seqs[i].g, self.seqs[i].L
            pending[(i, s)] = TreeSearch(g[s + 1 : s + 1 + min(self.B - 1, L - s)].tolist(), budget)
        self.search.update(pending)
        while pending:
            asks = []
            for key, search in list(pending.items()):
                have = self.rows.setdefault(key, [])
                while (d := search.need()) is not None and d <= len(have):
                    search.feed(*(t.tolist() for t in have[d - 1]))
                if d is None:
                    del pending[key]
                else:
                    asks.append(key)
            if asks:
                self._next_rows(asks, where)

    def _next_rows(self, keys: list[Key], where: dict) -> None:
        """Append the next depth rows to ``rows[key]`` for each of ``keys``, from the blocks
        in ``where`` (or kept), drafting the others (added to ``where`` for the search's
        later rounds)."""
        where.update(self._located(sorted(key for key in keys if key not in where)))
        blocks, index = self._joined(keys, where)
        rows, keys_of, depths = [], [], []
        for key, b in zip(keys, index.tolist(), strict=True):
            # as `_accept`: as many next depths as the block has rows (1, 2, 4, ...)
            first, i, s = len(self.rows[key]) + 1, *key
            last = min(2 * first - 1, self.B - 1, self.seqs[i].L - s) + 1
            for d in range(first, last):
                rows.append(b * self.B + d)
                keys_of.append(key)
                depths.append(d)
        self.head(blocks.hidden(torch.tensor(rows)), keys_of, depths)

    def forget(self, i: int, below: int) -> None:
        """Drop sequence ``i``'s rows, searches and kept blocks of starts before ``below``
        (no walk returns there)."""
        for s in range(self.kept_from[i], below):
            self.rows.pop((i, s), None)
            self.search.pop((i, s), None)
            self._drop((i, s))
        self.kept_from[i] = max(self.kept_from[i], below)
