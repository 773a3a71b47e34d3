"""Speculative-sampling acceptance along one sampled completion, in expectation.

Along a completion ``y`` sampled from the target at the engine's temperature, top-k and
top-p (``p``, processed by `remote.eval.logits.Processing`), the round starting at each
completion position accepts depth ``j``, given the depths before it were accepted, with
probability ``[argmax q_j == y]`` (``argmax`` drafts, vLLM's default) or
``min(1, q_j(y) / p(y))`` (``sample``: drafts from ``q`` at the temperature alone, vLLM's
``probabilistic``); `remote.eval.expectation.Expectation` turns those into expected
rounds, tau and per-position counts. The per-position counts weigh each attempt by its
acceptance probability over ``y``'s token too (``p(argmax q)``, or the overlap
``sum min(p, q)``): the curve without sampling noise. docs/dflash-eval.md derives it.

Here a block is drafted at every completion position (``--positions all``);
`remote.eval.seeded` does it at the walks' blocks.
torch is imported at module import: import this module lazily.
"""

from __future__ import annotations

import torch

from remote.eval.expectation import Expectation
from remote.eval.logits import Processing
from remote.eval.metrics import expected

LOGITS_BYTES = 64 * 2**20  # float32 drafter and target rows of one batch of blocks, at most


def accepts(qy: torch.Tensor, py: torch.Tensor) -> torch.Tensor:
    """P(a sampled draft is accepted | the target's token is y): min(1, q(y)/p(y))."""
    return torch.where(py > 0, (qy / py).clamp(max=1.0), torch.ones_like(py)).double()


@torch.inference_mode()
def acceptance(
    target,
    drafter,
    ids: list[int],
    prompt_tokens: int,
    features: torch.Tensor,
    final: torch.Tensor,
    processing: Processing,
    policy: str,
) -> tuple[list[list[float]], list[list[float]]]:
    """(acceptance probabilities, per-position weights) of the round at each walked
    position of ``ids`` (prompt + completion): row ``i`` for the round starting at
    ``ids[P + i]``, depth 1 first. `features`: the target's features over ``ids``;
    `final`: its final hidden rows from position ``P - 1`` on (what the head reads)."""
    P, B = prompt_tokens, drafter.block_size
    n = len(ids) - P - 1
    if n <= 0:
        return [], []
    g = torch.as_tensor(ids)
    head = target.lm_head
    vocab = head.shape[0]
    kv = drafter.context_kv(features)
    chunk = max(1, LOGITS_BYTES // (8 * B * vocab))
    acc: list[list[float]] = []
    alpha: list[list[float]] = []
    for a in range(0, n, chunk):
        starts = torch.arange(a, min(n, a + chunk))
        blocks = drafter.block_inputs(target.embed, g[P + starts])
        h = drafter.forward_blocks(kv, P + starts, blocks)[:, 1:]  # depths 1..B-1
        q_logits = drafter.logits(h, head).float()  # [nb, B-1, V]
        rows = (starts[:, None] + torch.arange(1, B)[None, :]).clamp(max=n)  # y's rows
        logp = processing.log_probs(target.head(final[rows]))  # [nb, B-1, V]
        y = g[P + rows]
        py = logp.gather(-1, y[..., None])[..., 0].exp()
        if policy == "argmax":
            x = q_logits.argmax(-1)
            a_j = (x == y).double()
            w_j = logp.gather(-1, x[..., None])[..., 0].exp().double()
        else:
            q = torch.softmax(q_logits / processing.temperature, dim=-1)
            qy = q.gather(-1, y[..., None])[..., 0]
            a_j = accepts(qy, py)
            w_j = torch.minimum(q, logp.exp()).sum(-1).double()
        acc += a_j.tolist()
        alpha += w_j.tolist()
    return acc, alpha


def expectation(
    target, drafter, ids, prompt_tokens, features, final, processing, policy
) -> Expectation:
    """`Expectation` of the completion's walk (see `acceptance`)."""
    acc, alpha = acceptance(
        target, drafter, ids, prompt_tokens, features, final, processing, policy
    )
    return Expectation.of(acc, drafter.block_size, alpha)


def annotate(records: list[dict], samples, target, drafter, spec, given=None) -> dict:
    """Each record's ``expected`` (`Expectation.to_json` of its completion at the spec's
    temperature, top-k, top-p and draft policy), and the run's summary (`summarize`).
    `given`: per sample (features, greedy, final rows) from the feature cache; None:
    the target's forward again."""
    processing = Processing(spec.temperature, spec.top_k, spec.top_p)
    layers = drafter.cfg.target_layer_ids
    dtype = drafter.fc.weight.dtype
    for n, (rec, (prompt, completion)) in enumerate(zip(records, samples, strict=True)):
        ids = list(prompt) + list(completion)
        if given is None:
            feats, _greedy, final = target.forward(
                ids, layers, argmax_from=len(prompt) - 1, final=True
            )
        else:
            feats, _greedy, final = given.again(n)
        got = expectation(
            target,
            drafter,
            ids,
            len(prompt),
            feats.to(dtype),
            final,
            processing,
            spec.draft_policy,
        )
        rec["expected"] = got.to_json()
    return summarize(records, spec, "dp")


def summarize(records: list[dict], spec, method: str) -> dict:
    """The run's ``expected`` by `method` at the spec's sampling (`metrics.expected`)."""
    settings = {k: getattr(spec, k) for k in ("temperature", "top_k", "top_p", "draft_policy")}
    return expected(records, {**settings, "seed": spec.seed}, method)
