"""The reference online loop: greedy speculative decoding as a server runs it, what the
eval engine is measured against (the tests) and timed against (the benchmarks).

Written independently of the engine: it drives transformers' own model class (the full
wrapper for a VLM, loaded with ``from_pretrained``) with ``output_hidden_states`` and either
a real KV cache cropped after each verification or, for targets whose recurrent state cannot
be cropped, a re-run over the whole accepted prefix every round. The drafter is called one
block at a time; its context K/V grows by the accepted tokens' rows (all of them again
after a re-run), as an online drafter keeps them.
"""

from __future__ import annotations

import inspect

import torch


def hf_model(path: str):
    """The checkpoint at `path` loaded by transformers itself, in float32."""
    import transformers
    from transformers import AutoConfig

    arch = AutoConfig.from_pretrained(path).architectures[0]
    return getattr(transformers, arch).from_pretrained(path, dtype=torch.float32).eval()


def cache_kwarg(model, cache) -> dict:
    """`cache` as the keyword `model.forward` takes it: ``cache`` where transformers has
    renamed it (``past_key_values`` is deprecated there and goes in 5.40), else
    ``past_key_values`` (the older 5.x releases pyproject still allows)."""
    params = inspect.signature(model.forward).parameters
    return {("cache" if "cache" in params else "past_key_values"): cache}


def features(hidden_states, layer_ids):
    """The drafter's context: the outputs of layers `layer_ids`, side by side."""
    # output_hidden_states index i+1 = output of layer i (ids here exclude the last layer)
    return torch.cat([hidden_states[i + 1][0] for i in layer_ids], dim=-1)


@torch.inference_mode()
def online_rounds(
    model, drafter, prompt: list[int], new_tokens: int, recompute: bool = False
) -> tuple[list[int], list[int]]:
    """Greedy speculative decoding; returns (acceptance length per round, completion).
    `recompute`: no target KV cache, the whole accepted prefix again every round."""
    from transformers import DynamicCache

    ids = drafter.cfg.target_layer_ids
    assert max(ids) < model.config.get_text_config().num_hidden_layers - 1
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    B = drafter.block_size
    cache = None if recompute else DynamicCache(config=model.config)
    out = model(
        input_ids=torch.tensor([prompt]),
        **cache_kwarg(model, cache),
        use_cache=not recompute,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    g = list(prompt) + [int(out.logits[0, -1].argmax())]
    kv = drafter.context_kv(features(out.hidden_states, ids))  # context rows 0..s-1
    end = len(prompt) + new_tokens - 1  # last index to produce
    s, rounds = len(prompt), []
    while s < end:
        block_in = drafter.block_inputs(embed, torch.tensor([g[s]]))
        h = drafter.forward_blocks(kv, torch.tensor([s]), block_in)[0]
        draft = drafter.logits(h[1:], head).argmax(-1).tolist()
        block = [g[s]] + draft
        if recompute:
            full = model(
                input_ids=torch.tensor([g[:s] + block]), use_cache=False, output_hidden_states=True
            )
            post = full.logits[0, s:].argmax(-1).tolist()
        else:
            full = model(
                input_ids=torch.tensor([block]),
                **cache_kwarg(model, cache),
                use_cache=True,
                output_hidden_states=True,
            )
            post = full.logits[0].argmax(-1).tolist()
        a = 0
        while a < B - 1 and draft[a] == post[a]:
            a += 1
        produced = min(a + 1, end - s)
        g += (draft[:a] + [post[a]])[:produced]
        if recompute:
            kv = drafter.context_kv(features(full.hidden_states, ids)[: s + produced])
        else:
            new = features(full.hidden_states, ids)[:produced]
            kv = [  # the drafter's context grows by the accepted rows only
                (torch.cat([k, nk], 1), torch.cat([v, nv], 1))
                for (k, v), (nk, nv) in zip(kv, _context_rows(drafter, new, s), strict=True)
            ]
            remove = cache.get_seq_length() - (s + produced)
            if remove:  # transformers 5.23: a NEGATIVE count removes that many tokens
                cache.crop(-remove)
        rounds.append(produced)
        s += produced
    return rounds, g[len(prompt) :]


def _context_rows(drafter, feats, first: int):
    """The drafter's context K/V of feature rows at positions ``first, first+1, ...``."""
    c = drafter.context(feats)
    cos, sin = drafter.rotary(torch.arange(first, first + feats.shape[0]), c.dtype)
    return [layer.self_attn.keys_values(c, cos, sin) for layer in drafter.layers]


@torch.inference_mode()
def ddtree_rounds(
    model, drafter, prompt: list[int], new_tokens: int, budget: int, topk: int | None = None
) -> tuple[list[int], list[int]]:
    """Greedy DDTree speculative decoding, as a tree-verifying server runs it; returns
    (acceptance length per round, completion). Each round: the drafter's block, its
    best-first tree of `budget` nodes (`remote.eval.ddtree.build_tree`, per-depth top-k
    as the eval's, depths cut at the completion's end as the walk cuts them), one target
    forward over the root and the nodes under the tree mask over the KV cache
    (`remote.eval.costs.tree_inputs`), the walk down the target's greedy tokens, and the
    cache and the drafter's context kept to the accepted path. Full-attention targets
    only (the accepted rows are gathered out of each layer's cache)."""
    from transformers import DynamicCache

    from remote.eval.costs import additive_mask, tree_inputs
    from remote.eval.ddtree import build_tree
    from remote.eval.metrics import ddtree_k

    ids = drafter.cfg.target_layer_ids
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=torch.tensor([prompt]),
        **cache_kwarg(model, cache),
        use_cache=True,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    g = list(prompt) + [int(out.logits[0, -1].argmax())]
    kv = drafter.context_kv(features(out.hidden_states, ids))
    end = len(prompt) + new_tokens - 1
    s, rounds = len(prompt), []
    k = ddtree_k(budget, topk, head.shape[0])
    while s < end:
        block_in = drafter.block_inputs(embed, torch.tensor([g[s]]))
        h = drafter.forward_blocks(kv, torch.tensor([s]), block_in)[0]
        depth = min(drafter.block_size - 1, end - s)
        logp = torch.log_softmax(drafter.logits(h[1 : 1 + depth], head).float(), dim=-1)
        top = logp.topk(k, dim=-1)
        nodes = build_tree(top.values.tolist(), top.indices.tolist(), budget)
        tokens, positions, allowed = tree_inputs(nodes, g[s], s)
        full = model(
            input_ids=torch.tensor([tokens]),
            **cache_kwarg(model, cache),
            use_cache=True,
            output_hidden_states=True,
            attention_mask=additive_mask(allowed, positions, s, None, torch.float32),
            position_ids=torch.tensor([positions]),
        )
        post = full.logits[0].argmax(-1).tolist()
        children: dict[int, dict[int, int]] = {}
        for row, (parent, _d, tok) in enumerate(nodes, 1):
            children.setdefault(parent + 1, {})[tok] = row
        path = [0]  # tree rows walked: the root, then each accepted node
        while post[path[-1]] in children.get(path[-1], {}):
            path.append(children[path[-1]][post[path[-1]]])
        produced = min(len(path), end - s)
        g += ([tokens[r] for r in path[1:]] + [post[path[-1]]])[:produced]
        keep = torch.tensor(list(range(s)) + [s + r for r in path[:produced]])
        for layer in cache.layers:  # the context and the accepted path's rows only
            layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
        new = features(full.hidden_states, ids)[torch.tensor(path[:produced])]
        kv = [
            (torch.cat([k_, nk], 1), torch.cat([v_, nv], 1))
            for (k_, v_), (nk, nv) in zip(kv, _context_rows(drafter, new, s), strict=True)
        ]
        rounds.append(produced)
        s += produced
    return rounds, g[len(prompt) :]


# ---- speculative sampling (temperature above 0) ------------------------------------------


def processed_probs(
    logits, temperature: float, top_k: int | None = None, top_p: float | None = None
):
    """The target's sampling distribution over each row of `logits`: over the temperature,
    the top-k kept, then the smallest set of the top-p mass (the first token always)."""
    x = logits.float() / temperature
    if top_k is not None and top_k < x.shape[-1]:
        x = x.masked_fill(x < torch.topk(x, top_k, dim=-1).values[..., -1:], float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p is not None and top_p < 1:
        ordered, order = probs.sort(dim=-1, descending=True)
        cut = ordered.cumsum(-1) - ordered >= top_p
        probs = probs.scatter(-1, order, ordered.masked_fill(cut, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _draw(probs, gen) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))


@torch.inference_mode()
def sampled_rounds(
    model,
    drafter,
    prompt: list[int],
    new_tokens: int,
    temperature: float,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    policy: str = "argmax",
    seed: int = 0,
    draft_temperature: float | None = None,
) -> dict:
    """Speculative sampling as an engine runs it at `temperature` (> 0), seeded: drafts
    the drafter's argmax (`policy` ``argmax``) or sampled from it at the temperature alone
    (``sample``), one target verify over the block, depth j accepted with probability
    p(x) (argmax) or min(1, p(x)/q(x)), the first rejected depth's token from the residual
    (p - q)+, a full block's bonus token from p. No KV cache (the whole prefix each round).
    `draft_temperature`: sample drafts at another temperature than q's (z-lab#74's bug,
    for the test that must catch it). Returns ``rounds``, ``completion`` and per depth
    ``attempts`` and ``hits``."""
    gen = torch.Generator().manual_seed(seed)
    ids = drafter.cfg.target_layer_ids
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    B = drafter.block_size

    def p_of(logits):
        return processed_probs(logits, temperature, top_k, top_p)

    out = model(input_ids=torch.tensor([prompt]), use_cache=False, output_hidden_states=True)
    g = list(prompt) + [_draw(p_of(out.logits[0, -1]), gen)]
    feats = features(out.hidden_states, ids)  # rows 0..len(g)-2
    end = len(prompt) + new_tokens - 1
    s, rounds = len(prompt), []
    attempts, hits = [0] * (B - 1), [0] * (B - 1)
    while s < end:
        h = drafter.forward_block(
            feats[:s], drafter.block_inputs(embed, torch.tensor([g[s]]))[0], s
        )
        logits = drafter.logits(h[1:], head).float()
        q = torch.softmax(logits / temperature, dim=-1)
        if policy == "argmax":
            draft = logits.argmax(-1).tolist()
        else:
            drawn = torch.softmax(logits / (draft_temperature or temperature), dim=-1)
            draft = [_draw(row, gen) for row in drawn]
        full = model(
            input_ids=torch.tensor([g[: s + 1] + draft]), use_cache=False, output_hidden_states=True
        )
        p = p_of(full.logits[0, s:])  # row j: the distribution at depth j + 1
        top, made = min(B - 1, end - s), []
        for j in range(top):
            x = draft[j]
            attempts[j] += 1
            ratio = p[j, x] if policy == "argmax" else min(1.0, float(p[j, x] / q[j, x]))
            if float(torch.rand(1, generator=gen)) < ratio:
                hits[j] += 1
                made.append(x)
                continue
            if policy == "argmax":
                left = p[j].clone()
                left[x] = 0.0
            else:
                left = (p[j] - q[j]).clamp(min=0.0)
            made.append(_draw(left / left.sum(), gen))
            break
        else:
            if top == B - 1:  # every depth accepted: the bonus token
                made.append(_draw(p[B - 1], gen))
        made = made[: end - s]
        g += made
        feats = features(full.hidden_states, ids)  # rows up to s + len(made) - 1 are g's
        rounds.append(len(made))
        s += len(made)
    return {
        "rounds": rounds,
        "completion": g[len(prompt) :],
        "attempts": attempts,
        "hits": hits,
    }
