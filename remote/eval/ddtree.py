"""DDTree's best-first draft trees (docs/dflash-eval.md); `TreeSearch` serves every budget."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def build_tree(
    logp: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]], budget: int
) -> list[tuple[int, int, int]]:
    """Nodes in pop order ``(parent, depth, token)`` from each depth's top-k."""
    depth_max = len(logp)
    if depth_max == 0 or budget <= 0:
        return []
    k = len(logp[0])
    nodes: list[tuple[int, int, int]] = []
    # (-score, tiebreak, depth (1-based), rank, parent index, parent score)
    heap = [(-float(logp[0][0]), 0, 1, 0, -1, 0.0)]
    tick = 1
    while heap and len(nodes) < budget:
        neg, _, d, r, parent, pscore = heapq.heappop(heap)
        score = -neg
        nodes.append((parent, d, int(tokens[d - 1][r])))
        me = len(nodes) - 1
        if r + 1 < k:
            heapq.heappush(
                heap, (-(pscore + float(logp[d - 1][r + 1])), tick, d, r + 1, parent, pscore)
            )
            tick += 1
        if d < depth_max:
            heapq.heappush(heap, (-(score + float(logp[d][0])), tick, d + 1, 0, me, score))
            tick += 1
    return nodes


def tree_accept(nodes: list[tuple[int, int, int]], truth: Sequence[int]) -> int:
    """Accepted draft tokens: nodes walked from the root along ``truth`` (greedy tokens)."""
    children: dict[int, dict[int, int]] = {}
    for i, (parent, _d, tok) in enumerate(nodes):
        children.setdefault(parent, {})[tok] = i
    cur, accepted = -1, 0
    for tok in truth:
        nxt = children.get(cur, {}).get(int(tok))
        if nxt is None:
            break
        cur, accepted = nxt, accepted + 1
    return accepted


def ddtree_accept(logp, tokens, truth: Sequence[int], budget: int) -> int:
    """`tree_accept` of `build_tree`: accepted draft tokens of DDTree-``budget``."""
    return tree_accept(build_tree(logp, tokens, budget), truth)


class TreeSearch:
    """DDTree acceptance of every budget at one position, rows fed on demand."""

    def __init__(self, truth: Sequence[int], budget: int):
        self.truth = [int(t) for t in truth]
        self.budget = budget
        self.rows: list[tuple[list[float], list[int]]] = []
        self.heap: list[tuple[float, int, int, int, int, float]] = []
        self.tick = 0
        self.pops = 0
        self.truth_pops: list[int] = []
        self.checked = 0
        self.done = budget <= 0 or not self.truth

    def feed(self, logp: Sequence[float], tokens: Sequence[int]) -> None:
        """Depth ``len(rows) + 1``'s top-k log-probabilities and tokens (what `need` asked)."""
        self.rows.append((list(logp), [int(t) for t in tokens]))

    def need(self) -> int | None:
        """The depth (1-based) whose row the search needs next, or None when it is done."""
        depth_max, rows, heap, truth = len(self.truth), self.rows, self.heap, self.truth
        while not self.done:
            nd = len(self.truth_pops) + 1
            if nd > depth_max or self.pops >= self.budget:
                self.done = True
                break
            if self.checked < nd:
                if len(rows) < nd:
                    return nd  # only depth 1 can be missing here (a popped parent pushed nd)
                if truth[nd - 1] not in rows[nd - 1][1]:
                    self.done = True
                    break
                self.checked = nd
            if self.tick == 0:
                heap.append((-float(rows[0][0][0]), 0, 1, 0, -1, 0.0))
                self.tick = 1
            if not heap:
                self.done = True
                break
            d = heap[0][2]
            if d < depth_max and len(rows) <= d:
                return d + 1  # the node about to pop pushes its first child from depth d+1
            neg, _, d, r, parent, pscore = heapq.heappop(heap)
            score = -neg
            me = self.pops
            self.pops += 1
            logp, toks = rows[d - 1]
            parent_truth = self.truth_pops[-1] if self.truth_pops else -1
            if d == nd and parent == parent_truth and toks[r] == truth[d - 1]:
                self.truth_pops.append(me)
            if r + 1 < len(logp):
                heapq.heappush(
                    heap, (-(pscore + float(logp[r + 1])), self.tick, d, r + 1, parent, pscore)
                )
                self.tick += 1
            if d < depth_max:
                child = -(score + float(rows[d][0][0]))
                heapq.heappush(heap, (child, self.tick, d + 1, 0, me, score))
                self.tick += 1
        return None

    def accepted(self, budget: int) -> int:
        """Accepted draft tokens of DDTree-``budget`` (``budget`` <= the search's, done)."""
        return sum(1 for p in self.truth_pops if p < budget)
