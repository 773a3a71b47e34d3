"""DDTree: best-first draft trees over a DFlash drafter's per-depth distributions.

Pure Python over small tensors/lists, no model here. The tree rule (dflash-eval.md):
each depth ``d = 1..D`` offers its top-``k`` tokens sorted by log-probability; candidates are
(depth, rank, parent) with score = parent's score + logp[d][rank]; start with depth 1 rank 0;
every popped node adds its next sibling (same parent, rank+1) and its first child
(depth+1, rank 0); stop at ``budget`` nodes. Verification walks from the root while the
target's greedy next token is a child of the current node.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def build_tree(
    logp: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]], budget: int
) -> list[tuple[int, int, int]]:
    """The tree's nodes in pop order as ``(parent_index, depth, token)``; parent -1 = root.

    ``logp[d][r]`` / ``tokens[d][r]``: depth ``d+1``'s rank-``r`` log-probability and token,
    ranks sorted by descending log-probability.
    """
    depth_max = len(logp)
    if depth_max == 0 or budget <= 0:
        return []
    k = len(logp[0])
    nodes: list[tuple[int, int, int]] = []
    # heap entries: (-score, tiebreak, depth (1-based), rank, parent index, parent score)
    heap = [(-float(logp[0][0]), 0, 1, 0, -1, 0.0)]
    tick = 1
    while heap and len(nodes) < budget:
        neg, _, d, r, parent, pscore = heapq.heappop(heap)
        score = -neg
        nodes.append((parent, d, int(tokens[d - 1][r])))
        me = len(nodes) - 1
        if r + 1 < k:  # next sibling: same parent, next rank at this depth
            heapq.heappush(
                heap, (-(pscore + float(logp[d - 1][r + 1])), tick, d, r + 1, parent, pscore)
            )
            tick += 1
        if d < depth_max:  # first child
            heapq.heappush(heap, (-(score + float(logp[d][0])), tick, d + 1, 0, me, score))
            tick += 1
    return nodes


def tree_accept(nodes: list[tuple[int, int, int]], truth: Sequence[int]) -> int:
    """Accepted draft tokens: nodes walked from the root while ``truth[i]`` (the target's
    greedy token at depth ``i+1``) is a child of the current node."""
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
