"""DDTree tree building and acceptance against a brute-force enumeration.

Brute force: enumerate EVERY path (r_1..r_d) of per-depth ranks, score it by summed
log-probability, keep the ``budget`` best (the best-first tree is exactly that set, because
children and later siblings never score higher than what expanded them), then accept the
longest ground-truth prefix that is a path of kept nodes.
"""

from __future__ import annotations

import itertools
import random

import pytest

from remote.eval.ddtree import TreeSearch, build_tree, ddtree_accept


def random_table(rng: random.Random, depth: int, k: int, vocab: int):
    logp, toks = [], []
    for _ in range(depth):
        vals = sorted((-rng.expovariate(1.0) * rng.uniform(0.2, 3) for _ in range(k)), reverse=True)
        logp.append(vals)
        toks.append(rng.sample(range(vocab), k))  # distinct tokens per depth, like a top-k
    return logp, toks


def brute_force(logp, toks, truth, budget) -> int:
    depth, k = len(logp), len(logp[0])
    paths = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            paths.append((sum(logp[i][r] for i, r in enumerate(ranks)), ranks))
    kept = {ranks for _, ranks in sorted(paths, key=lambda p: -p[0])[:budget]}
    accepted, prefix = 0, ()
    for i, tok in enumerate(truth):
        nxt = next(
            (prefix + (r,) for r in range(k) if toks[i][r] == tok and prefix + (r,) in kept), None
        )
        if nxt is None:
            break
        prefix, accepted = nxt, accepted + 1
    return accepted


def test_ddtree_matches_brute_force_on_random_tables():
    rng = random.Random(0)
    checked_deep = 0
    for _ in range(400):
        depth, k, vocab = rng.randint(1, 4), rng.randint(1, 4), 6
        logp, toks = random_table(rng, depth, k, vocab)
        # truth often follows high-ranked tokens, so acceptances are non-trivial
        truth = [
            toks[i][min(int(rng.expovariate(1.2)), k - 1)]
            if rng.random() < 0.85
            else rng.randrange(vocab)
            for i in range(depth)
        ]
        for budget in (1, 2, 3, 5, 8, 40):
            got = ddtree_accept(logp, toks, truth, budget)
            assert got == brute_force(logp, toks, truth, budget)
            assert got <= min(budget, depth)
            checked_deep += got >= 2
    assert checked_deep > 100  # the comparison exercised deep acceptances, not just zeros


def test_tree_shape_and_order():
    logp = [[-0.1, -2.0, -3.0], [-0.5, -0.7, -4.0], [-0.2, -1.0, -1.5]]
    toks = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    nodes = build_tree(logp, toks, 5)
    # scores: (1:10)=-.1, (2:20)=-.6, (2:21)=-.8, (3:30 under 20)=-.8, (3:30 under 21)=-1.0
    assert [(d, t) for _p, d, t in nodes] == [(1, 10), (2, 20), (2, 21), (3, 30), (3, 30)]
    assert [p for p, _d, _t in nodes] == [-1, 0, 0, 1, 2]
    assert len(build_tree(logp, toks, 100)) == 3 + 9 + 27
    assert build_tree(logp, toks, 0) == []


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_top1_tree_is_the_greedy_chain(budget):
    logp = [[-0.3], [-0.2], [-0.9]]
    toks = [[5], [6], [7]]
    assert ddtree_accept(logp, toks, [5, 6, 7], budget) == min(budget, 3)
    assert ddtree_accept(logp, toks, [5, 9, 7], budget) == min(budget, 1)


def test_tree_search_answers_every_budget_and_reads_only_the_depths_it_needs():
    """One `TreeSearch` of the largest budget gives `ddtree_accept` of every smaller budget
    (each with its own per-depth k), reading depth rows only on demand."""
    rng = random.Random(1)
    deep = 0
    for _ in range(300):
        depth, vocab = rng.randint(1, 5), 7
        topk = rng.choice([None, 1, 2, 3])
        budgets = sorted(rng.sample(range(1, 30), 4))
        k_of = {n: min(n, vocab, topk or n) for n in budgets}
        k_max = k_of[budgets[-1]]
        logp, toks = random_table(rng, depth, k_max, vocab)
        truth = [
            toks[i][min(int(rng.expovariate(1.0)), k_max - 1)]
            if rng.random() < 0.85
            else rng.randrange(vocab)
            for i in range(depth)
        ]
        search = TreeSearch(truth, budgets[-1])
        asked = []
        while (d := search.need()) is not None:
            asked.append(d)
            search.feed(logp[d - 1], toks[d - 1])
        assert asked == list(range(1, len(asked) + 1))  # depth by depth, each once
        if truth[0] not in toks[0]:
            assert asked == [1]  # a miss at depth 1 costs one row
        for n in budgets:
            k = k_of[n]
            want = ddtree_accept([r[:k] for r in logp], [r[:k] for r in toks], truth, n)
            assert search.accepted(n) == want
            deep += want >= 2
    assert deep > 50


def test_tree_search_stops_at_the_budget():
    # flat distributions: every pop is a depth-1 node, so depth 3 is never read
    logp = [[-1.0] * 4, [-5.0] * 4, [-5.0] * 4]
    toks = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    search = TreeSearch([4, 5, 9], 4)
    while (d := search.need()) is not None:
        search.feed(logp[d - 1], toks[d - 1])
    assert len(search.rows) == 2 and search.accepted(4) == 1 and search.accepted(3) == 0
