"""Drafted blocks of the samples walking together, batched in bounded bytes; lazy import (torch)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from remote.eval.ddtree import TreeSearch
from remote.eval.target import greedy_tokens

SCORES_BYTES = 16 * 2**20  # attention scores of one batched drafter call, at most
# time.process_time on a shared benchmark machine, where wall time moves with load
CLOCK = time.perf_counter
KEPT_BYTES = 64 * 2**20  # drafted blocks' last-layer inputs kept for later tree searches, at most


def auto_chunk(cfg, context: int, budget: int = SCORES_BYTES) -> int:
    """Blocks per drafter call keeping float32 scores under ``budget``."""
    from remote.eval.drafter_layers import CONTEXT_CHUNK

    rows = cfg.block_size if cfg.num_layers > 1 else 1
    per_block = 3 * 4 * rows * cfg.num_heads * (min(context, CONTEXT_CHUNK) + cfg.block_size)
    return max(16, min(1024, budget // per_block))


@dataclass
class Seq:
    """One sample as the drafter sees it: ids ``g``, prompt length ``P``, context K/V ``kv``."""

    g: torch.Tensor
    P: int
    kv: list

    @property
    def L(self) -> int:
        return len(self.g) - 1


Key = tuple[int, int]


class Drafts:
    """Drafted blocks of walking sequences (docs/dflash-eval.md, Drafted blocks)."""

    HEAD_BYTES = 8 * 2**20
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
        self.chunk = chunk or auto_chunk(drafter.cfg, longest or max(q.L for q in seqs))
        self.k = k
        self.head_rows = self.rows_per_head(target.lm_head.shape[0])
        self.seqs: list[Seq | None] = []
        self.live: dict[int, Seq] = {}
        self.last = torch.zeros(0, dtype=torch.long)
        self.accept: dict[Key, int] = {}
        self.preds: dict[Key, list[int]] | None = None  # a dict: argmax drafts kept (T > 0)
        self.rows: dict[Key, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.search: dict[Key, TreeSearch] = {}
        self.kept_from: list[int] = []
        self.built: list[int] = []
        self.kept: dict[Key, tuple[object, int]] = {}
        self.held: dict[int, list[int]] = {}
        self.kept_bytes = 0
        for q in seqs:
            self.add(q)

    def add(self, q: Seq) -> int:
        """Take sequence ``q`` in; returns its index (the first element of its blocks' keys)."""
        i = len(self.seqs)
        self.seqs.append(q)
        self.live[i] = q
        self.kept_from.append(q.P)
        self.built.append(0)
        self.last = torch.cat((self.last, torch.tensor([q.L])))
        self._index()
        return i

    def release(self, i: int) -> None:
        """Drop everything sequence ``i`` holds (its walks have ended and its record is made)."""
        self.forget(i, self.seqs[i].L + 1)
        for key in [key for key in self.accept if key[0] == i]:
            del self.accept[key]
            if self.preds is not None:
                self.preds.pop(key, None)
        self.seqs[i] = None
        del self.live[i]
        self._index()

    def _index(self) -> None:
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
        """Greedy tokens of hidden rows ``h``; with ``k``, top-k rows kept."""
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
                got = zip(keys[at], depths[at], v.unbind(), i.unbind(), strict=True)
                for key, d, vr, ir in got:
                    have = self.rows.setdefault(key, [])
                    if len(have) == d - 1:
                        have.append((vr, ir))
        return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)

    def _build(self, keys: list[Key]):
        """The drafter's blocks at sorted ``keys`` in one call: (Blocks, sequences, starts)."""
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
            if held[1] == 0:
                self.kept_bytes -= held[0]
                del self.held[id(got[0])]

    def _located(self, keys: list[Key]) -> dict[Key, tuple[object, int]]:
        """(Blocks, index there) of each of ``keys``: kept, or drafted now."""
        where = {key: self.kept[key] for key in keys if key in self.kept}
        new = [key for key in keys if key not in where]
        for c in range(0, len(new), self.chunk):
            part = new[c : c + self.chunk]
            blocks, _seq, _st = self._build(part)
            where.update((key, (blocks, b)) for b, key in enumerate(part))
        return where

    def draft(self, chain: list[Key], trees: list[Key], budget: int, extra=None) -> float:
        """One lockstep step of every walk; the tree searches' seconds. `extra`: (keys,
        fn) drafted in the same calls, then ``fn(blocks, index, keys)``."""
        todo = sorted({key for key in chain if key not in self.accept})
        search = sorted({key for key in trees if key not in self.search})
        more = sorted(set(extra[0])) if extra else []
        where = self._located(sorted(set(todo) | set(search) | set(more)))
        if todo:
            self._accept(*self._joined(todo, where), todo)
        if more:
            extra[1](*self._joined(more, where), more)
        t = CLOCK()
        if search:
            self._search(search, budget, where)
        return CLOCK() - t

    def _truth(self, seq: torch.Tensor, st: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        at = st[:, None] + torch.arange(self.B)[None, :]
        ok = at <= self.last[seq][:, None]
        index = self.offset[seq][:, None] + torch.minimum(at, self.last[seq][:, None])
        return self.flat[index], ok

    def ensure(self, keys: list[Key]) -> None:
        """Compute ``accept`` for ``keys`` not known yet, ``chunk`` blocks at a time."""
        todo = sorted({key for key in keys if key not in self.accept})
        for c in range(0, len(todo), self.chunk):
            part = todo[c : c + self.chunk]
            blocks, _seq, _st = self._build(part)
            self._accept(blocks, torch.arange(len(part)), part)

    @staticmethod
    def _joined(keys: list[Key], where: dict) -> tuple[object, torch.Tensor]:
        """One Blocks of ``keys`` from several calls, each one's index."""
        from remote.eval.drafter_model import Blocks

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
        seq = torch.tensor([i for i, _s in part])
        st = torch.tensor([s for _i, s in part])
        truth, ok = self._truth(seq, st)
        acc = torch.zeros(len(part), dtype=torch.long)
        drafted = torch.full((len(part), self.B), -1, dtype=torch.long)
        alive, j, width = torch.arange(len(part)), 1, 1
        while j < self.B and len(alive):
            # doubling windows: fewer passes over the weights, at most twice the rows needed
            w, width = min(self.B - j, width), 2 * width
            blk = alive[:, None].expand(-1, w)
            depth = torch.arange(j, j + w)[None, :].expand(len(alive), -1)
            have = ok[blk, depth]
            pred = torch.full(have.shape, -1, dtype=torch.long)
            if not bool(have.any()):
                break
            hid = blocks.depths(index[alive], j, w)
            pred[have] = self.head(
                hid[have], [part[b] for b in blk[have].tolist()], depth[have].tolist()
            )
            drafted[blk, depth] = pred
            right = (pred == truth[blk, depth]) & have
            run = right.long().cumprod(1).sum(1)
            acc[alive] += run
            alive, j = alive[run == w], j + w
        self.accept.update(zip(part, acc.tolist(), strict=True))
        if self.preds is not None:
            self.preds.update(zip(part, drafted.tolist(), strict=True))

    def trees(self, keys: list[Key], budget: int) -> None:
        """Run the `TreeSearch` of ``budget`` at ``keys`` not searched yet, ``chunk`` at a time."""
        todo = sorted({key for key in keys if key not in self.search})
        for c in range(0, len(todo), self.chunk):
            self._search(todo[c : c + self.chunk], budget, {})

    def _search(self, group: list[Key], budget: int, where: dict) -> None:
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
        """Append the next depth rows to ``rows[key]`` of each key, drafting what is not at hand."""
        where.update(self._located(sorted(key for key in keys if key not in where)))
        blocks, index = self._joined(keys, where)
        rows, keys_of, depths = [], [], []
        for key, b in zip(keys, index.tolist(), strict=True):
            first, i, s = len(self.rows[key]) + 1, *key
            last = min(2 * first - 1, self.B - 1, self.seqs[i].L - s) + 1
            for d in range(first, last):
                rows.append(b * self.B + d)
                keys_of.append(key)
                depths.append(d)
        self.head(blocks.hidden(torch.tensor(rows)), keys_of, depths)

    def forget(self, i: int, below: int) -> None:
        """Drop sequence ``i``'s rows, searches and kept blocks before ``below``."""
        for s in range(self.kept_from[i], below):
            self.rows.pop((i, s), None)
            self.search.pop((i, s), None)
            self._drop((i, s))
        self.kept_from[i] = max(self.kept_from[i], below)
