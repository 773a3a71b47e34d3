"""How many bytes an eval will take, estimated before anything is loaded (the engine
refuses a run the host cannot hold: `remote.eval.engine.run_eval`)."""

from __future__ import annotations


def estimate_bytes(
    tbytes: int,
    dcfg,
    max_len: int,
    itemsize: int,
    block_chunk: int | None,
    positions: str = "walk",
) -> int:
    """Peak bytes: target text weights + drafter weights + the largest sequence's working set
    (hidden states, kept features, drafter context K/V, one batch of blocks with its
    attention scores, one head call's logits with their float32 log-softmax, the blocks
    kept for tree searches); with
    ``positions="walk"``, the context K/V of the samples walking in lockstep
    (`remote.eval.walk.eval_stream`)."""
    from remote.eval.drafts import KEPT_BYTES, SCORES_BYTES, Drafts, auto_chunk
    from remote.eval.walk import LOCKSTEP_BYTES, LOCKSTEP_SAMPLES, context_kv_bytes

    h, B, k = dcfg.hidden_size, dcfg.block_size, len(dcfg.target_layer_ids)
    per_layer = (
        4 * dcfg.hidden_size * dcfg.hidden_size + 3 * dcfg.hidden_size * dcfg.intermediate_size
    )
    drafter = (dcfg.num_layers * per_layer + k * h * h) * itemsize
    kv = context_kv_bytes(dcfg, max_len, itemsize)
    if positions == "walk":  # a batch holds LOCKSTEP_BYTES of them, or one sample's at least
        kv = max(kv, min(LOCKSTEP_BYTES, LOCKSTEP_SAMPLES * kv))
    chunk = block_chunk or auto_chunk(dcfg, max_len)
    blocks = chunk * B * (h + 2 * dcfg.num_kv_heads * dcfg.head_dim) * itemsize * 4
    head = 10 * dcfg.vocab_size * Drafts.rows_per_head(dcfg.vocab_size)  # bf16 + 2 x float32
    acts = max_len * h * (k + 8) * 4 + kv + SCORES_BYTES + blocks + head + KEPT_BYTES
    return tbytes + drafter + acts
