"""Speculative-sampling acceptance at ``positions: walk`` (docs/dflash-eval.md), computed
at the blocks the walks draft: for argmax drafts the chain walk's own rounds (exact for the
completion), for sampled drafts one walk per sample seeded by `walk_seed`, depth ``j`` of
the round at ``s`` accepted while ``u[s, j] < min(1, q_j(y)/p_j(y))`` (`sampled.accepts`).
Per-position hits are weighted as `remote.eval.sampled` weighs them.
torch is imported at module import: import this module lazily.
"""

from __future__ import annotations

from collections import Counter

import torch

from remote.eval.logits import Processing
from remote.eval.metrics import round_starts
from remote.eval.sampled import accepts
from remote.protocol.sampling import request_seed


def walk_seed(seed: int, sample_id: str) -> int:
    """The seed of sample `sample_id`'s drawn walk in a job seeded with `seed`: the same for
    every checkpoint (common random numbers)."""
    return request_seed(seed, f"walk:{sample_id}", 0)


class Walks:
    """`WalkOptions.sampler` of a sampled eval: each sequence's final target rows (``p``),
    its uniforms, and what the drawn walk found at each block it drafted."""

    def __init__(self, target, processing: Processing, policy: str, seed: int, ids: list[str]):
        self.target, self.processing, self.policy = target, processing, policy
        self.seed, self.ids = seed, ids
        self.draws = policy == "sample"
        self.final: dict[int, torch.Tensor] = {}
        self.u: dict[int, torch.Tensor] = {}
        self.drawn: dict[tuple[int, int], int] = {}
        self.weights: dict[tuple[int, int], list[float]] = {}

    def attach(self, drafts) -> None:
        """Have `drafts` keep its argmax drafts (their weights, for argmax drafts)."""
        if not self.draws:
            drafts.preds = {}

    def join(self, i: int, final: torch.Tensor, width: int, block: int) -> None:
        """Sequence ``i`` (its `ids` entry): its final rows from ``P - 1`` on, ``width``
        completion tokens to walk."""
        self.final[i] = final
        if self.draws:
            gen = torch.Generator().manual_seed(walk_seed(self.seed, self.ids[i]))
            self.u[i] = torch.rand((width + 1, block), generator=gen, dtype=torch.float64)

    def leave(self, i: int) -> None:
        self.final.pop(i, None)
        self.u.pop(i, None)
        for key in [key for key in self.drawn if key[0] == i]:
            del self.drawn[key]
            self.weights.pop(key, None)

    def _gather(self, drafts, at: list) -> tuple[torch.Tensor, ...]:
        """(target's log-probs, ``y``, uniforms) at ``(sequence, start, depth)`` rows."""
        seq, start, depth = torch.tensor(at, dtype=torch.long).reshape(-1, 3).unbind(1)
        h = self.final[at[0][0]].new_empty((len(at), self.final[at[0][0]].shape[-1]))
        y = torch.empty(len(at), dtype=torch.long)
        u = torch.ones(len(at), dtype=torch.float64)
        for i in seq.unique().tolist():
            m, q = seq == i, drafts.seqs[i]
            row = start[m] - q.P + depth[m]
            h[m], y[m] = self.final[i][row], q.g[q.P + row]
            if self.draws:
                u[m] = self.u[i][start[m] - q.P, depth[m]]
        return self.processing.log_probs(self.target.head(h)), y, u

    def draw(self, drafts, blocks, index: torch.Tensor, keys: list[tuple[int, int]]) -> None:
        """The drawn walk's accepted depths at ``keys`` (Drafts.draft's ``extra``): depth by
        depth in doubling windows, as `Drafts` finds the argmax walk's."""
        B, acc = drafts.B, [0] * len(keys)
        alive, j, width = list(range(len(keys))), 1, 1
        while j < B and alive:
            w, width = min(B - j, width), 2 * width
            hid = blocks.depths(index[torch.tensor(alive)], j, w)
            asked = [
                (a, d)
                for a, b in enumerate(alive)
                for d in range(j, min(j + w, drafts.seqs[keys[b][0]].L - keys[b][1] + 1))
            ]
            got: dict[tuple[int, int], tuple[bool, float]] = {}
            for c in range(0, len(asked), drafts.head_rows):
                part = asked[c : c + drafts.head_rows]
                rows = hid[
                    torch.tensor([a for a, _d in part]), torch.tensor([d - j for _a, d in part])
                ]
                at = [(*keys[alive[a]], d) for a, d in part]  # (sequence, start, depth)
                found = self._depths(drafts, rows, at)
                got.update(zip(part, found, strict=True))
            nxt = []
            for a, b in enumerate(alive):
                key, run = keys[b], True
                for d in range(j, j + w):
                    if (a, d) not in got:
                        run = False
                        break
                    hit, wt = got[(a, d)]
                    self.weights.setdefault(key, []).append(wt)
                    if not hit:
                        run = False
                        break
                    acc[b] += 1
                if run:
                    nxt.append(b)
            alive, j = nxt, j + w
        self.drawn.update(zip(keys, acc, strict=True))

    def _depths(self, drafts, rows: torch.Tensor, at: list) -> list[tuple[bool, float]]:
        """(accepted by the draw, weight ``sum min(p, q)``) of drafter rows ``rows`` at
        ``(sequence, start, depth)``."""
        q_logits = drafts.drafter.logits(rows, self.target.lm_head).float()
        q = torch.softmax(q_logits / self.processing.temperature, dim=-1)
        logp, y, u = self._gather(drafts, at)
        p = logp.exp()
        a_j = accepts(q.gather(-1, y[:, None])[:, 0], p.gather(-1, y[:, None])[:, 0])
        w_j = torch.minimum(p, q).sum(-1)
        return list(zip((u < a_j).tolist(), w_j.tolist(), strict=True))

    def expected(self, drafts, i: int, walked) -> dict:
        """Sequence ``i``'s ``expected`` block (`Expectation.to_json`'s keys) once its walks
        ended (`remote.eval.walk.Walked`)."""
        q, B = drafts.seqs[i], drafts.B
        rounds = walked.drawn if self.draws else walked.rounds
        attempts, hits = [0.0] * (B - 1), [0.0] * (B - 1)
        starts = round_starts(q.P, rounds)
        if self.draws:
            for s in starts:
                for j, wt in enumerate(self.weights.get((i, s), [])):
                    attempts[j] += 1
                    hits[j] += wt
        else:
            tried = [
                (s, j)
                for s in starts
                for j in range(1, min(drafts.accept[(i, s)] + 1, B - 1, q.L - s) + 1)
            ]
            for c in range(0, len(tried), drafts.head_rows):
                part = tried[c : c + drafts.head_rows]
                logp = self._gather(drafts, [(i, s, j) for s, j in part])[0]
                x = torch.tensor([drafts.preds[(i, s)][j] for s, j in part])
                for (_s, j), wt in zip(
                    part, logp.gather(-1, x[:, None])[:, 0].exp().tolist(), strict=True
                ):
                    attempts[j - 1] += 1
                    hits[j - 1] += wt
        n = q.L - q.P
        return {
            "tokens": n,
            "rounds": len(rounds),
            "tau": n / len(rounds) if rounds else None,
            "histogram": {str(r): c for r, c in sorted(Counter(rounds).items())},
            "position_attempts": attempts,
            "position_hits": hits,
        }
