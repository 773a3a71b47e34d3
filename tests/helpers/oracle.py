"""The reference the eval engine is measured against: online greedy speculative decoding
(`orchestrator.demo.oracle`, the one loop the benchmarks time too), under the names the
tests import, and DDTree rounds built the plain way."""

import torch

from orchestrator.demo.oracle import cache_kwarg as cache_kwarg
from orchestrator.demo.oracle import features as features
from orchestrator.demo.oracle import hf_model as hf_model
from orchestrator.demo.oracle import online_rounds as online_rounds


def plain_ddtree_rounds(target, drafter, prompt, completion, budgets, topk) -> dict:
    """DDTree rounds the plain way: every position's whole block through `forward_block`,
    every depth's top-k from the full head, one `ddtree_accept` per budget and round."""
    from remote.eval.ddtree import ddtree_accept
    from remote.eval.metrics import ddtree_k

    g = list(prompt) + list(completion)
    P, L, B = len(prompt), len(g) - 1, drafter.block_size
    vocab = target.info.vocab_size
    feats, _ = target.forward(g, drafter.cfg.target_layer_ids)
    k_max = ddtree_k(max(budgets), topk, vocab)
    tables = {}
    for s in range(P, L):
        h = drafter.forward_block(
            feats[:s], drafter.block_inputs(target.embed, torch.tensor([g[s]]))[0], s
        )
        logp = torch.log_softmax(drafter.logits(h[1:], target.lm_head).float(), dim=-1)
        v, i = torch.topk(logp, k_max, dim=-1)
        depth = min(B - 1, L - s)
        tables[s] = (v[:depth].tolist(), i[:depth].tolist())
    out = {}
    for n in budgets:
        k, s, rounds = ddtree_k(n, topk, vocab), P, []
        while s < L:
            v, i = tables[s]
            a = ddtree_accept([r[:k] for r in v], [r[:k] for r in i], g[s + 1 : s + 1 + len(v)], n)
            rounds.append(min(a + 1, L - s))
            s += rounds[-1]
        out[str(n)] = rounds
    return out
