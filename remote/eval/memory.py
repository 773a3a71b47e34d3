"""How many bytes an eval will take, estimated before anything is loaded: the engine
refuses a run the host cannot hold (`remote.eval.engine.run_eval`), and the job's
preflight adds the longest context's working set to the weights it counts
(`remote.eval.preflight`)."""

from __future__ import annotations

# Hidden-sized float32 rows of the target's forward alive at once per position (its
# residual stream, a layer's input and output, the MLP's wider intermediates).
ACTIVATION_ROWS = 8


def estimate_bytes(
    tbytes: int,
    dcfg,
    max_len: int,
    itemsize: int,
    block_chunk: int | None,
    positions: str = "walk",
) -> int:
    """Peak bytes: target text weights + drafter weights + the longest sequence's working
    set (`context_bytes`)."""
    h, k = dcfg.hidden_size, len(dcfg.target_layer_ids)
    per_layer = 4 * h * h + 3 * h * dcfg.intermediate_size
    drafter = (dcfg.num_layers * per_layer + k * h * h) * itemsize
    return tbytes + drafter + context_bytes(dcfg, max_len, itemsize, block_chunk, positions)


def context_bytes(
    dcfg, max_len: int, itemsize: int, block_chunk: int | None = None, positions: str = "walk"
) -> int:
    """The working set of a sequence of `max_len` tokens, every part bounded by the
    context's length times a constant: the target's features at the drafter's layers
    (once: each layer's output is copied into them as it comes, `remote.eval.target`,
    and a feature-cache entry is read straight into them) and its activations; the
    drafter's context K/V (with
    ``positions="walk"``, of the samples walking in lockstep: `remote.eval.walk`); one
    drafter call's blocks and float32 attention scores (a context past `CONTEXT_CHUNK`
    positions taken a chunk at a time: `remote.eval.drafter_layers.Attention.mix`); one
    head call's logits with their float32 log-softmax; the blocks kept for tree
    searches."""
    from remote.eval.drafter_layers import CONTEXT_CHUNK
    from remote.eval.drafts import KEPT_BYTES, Drafts, auto_chunk
    from remote.eval.walk import LOCKSTEP_BYTES, LOCKSTEP_SAMPLES, context_kv_bytes

    h, B, k = dcfg.hidden_size, dcfg.block_size, len(dcfg.target_layer_ids)
    features = max_len * k * h * itemsize
    acts = max_len * h * ACTIVATION_ROWS * 4
    kv = context_kv_bytes(dcfg, max_len, itemsize)
    if positions == "walk":  # a batch holds LOCKSTEP_BYTES of them, or one sample's at least
        kv = max(kv, min(LOCKSTEP_BYTES, LOCKSTEP_SAMPLES * kv))
    chunk = block_chunk or auto_chunk(dcfg, max_len)
    rows = B if dcfg.num_layers > 1 else 1
    scores = chunk * 3 * 4 * rows * dcfg.num_heads * (min(max_len, CONTEXT_CHUNK) + B)
    blocks = chunk * B * (h + 2 * dcfg.num_kv_heads * dcfg.head_dim) * itemsize * 4
    head = 10 * dcfg.vocab_size * Drafts.rows_per_head(dcfg.vocab_size)  # bf16 + 2 x float32
    return features + acts + kv + scores + blocks + head + KEPT_BYTES
