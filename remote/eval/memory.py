"""An eval's bytes, estimated before anything loads (engine refusal, preflight)."""

from __future__ import annotations

# hidden-sized float32 rows alive per position in the target's forward
ACTIVATION_ROWS = 8


def estimate_bytes(
    tbytes: int,
    dcfg,
    max_len: int,
    itemsize: int,
    block_chunk: int | None,
    positions: str = "walk",
    sampled: bool = False,
    widens: bool = False,
) -> int:
    """Peak bytes: target text weights + drafter weights + the longest sequence's working
    set (`sampled`: above temperature 0, with the rows a seeded walk keeps at ``walk``;
    `widens`: bf16 products computed in float32, with `widening_bytes`)."""
    h, k = dcfg.hidden_size, len(dcfg.target_layer_ids)
    per_layer = 4 * h * h + 3 * h * dcfg.intermediate_size
    drafter = (dcfg.num_layers * per_layer + k * h * h) * itemsize
    working = context_bytes(dcfg, max_len, itemsize, block_chunk, positions)
    return (
        tbytes
        + drafter
        + working
        + (seeded_bytes(dcfg, max_len, itemsize) if sampled and positions == "walk" else 0)
        + (widening_bytes(h, dcfg.vocab_size, dcfg) if widens else 0)
    )


def widening_bytes(hidden: int, vocab: int, dcfg=None) -> int:
    """The float32 buffer `remote.eval.cpu_bf16.widen` keeps in the computing thread, where
    bf16 products are computed in float32: the largest weight's elements, a slice at most.
    That is the head (``vocab`` x ``hidden``) as a rule; given the drafter's config, its fc
    and MLP weights count too."""
    from remote.eval.cpu_bf16 import SLICE_ELEMENTS

    largest = vocab * hidden
    if dcfg is not None:
        h = dcfg.hidden_size
        largest = max(largest, h * dcfg.intermediate_size, len(dcfg.target_layer_ids) * h * h)
    return 4 * min(largest, SLICE_ELEMENTS)


def seeded_bytes(dcfg, max_len: int, itemsize: int) -> int:
    """What the seeded walks of a lockstep keep (`remote.eval.seeded.Walks`): each
    sequence's final target rows and its float64 uniforms, a row per position."""
    from remote.eval.walk import LOCKSTEP_SAMPLES

    per_position = dcfg.hidden_size * itemsize + (dcfg.block_size + 1) * 8
    return LOCKSTEP_SAMPLES * max_len * per_position


def context_bytes(
    dcfg, max_len: int, itemsize: int, block_chunk: int | None = None, positions: str = "walk"
) -> int:
    """The working set of a `max_len`-token sequence, each part linear in it."""
    from remote.eval.drafter_layers import CONTEXT_CHUNK
    from remote.eval.drafts import KEPT_BYTES, Drafts, auto_chunk
    from remote.eval.walk import LOCKSTEP_BYTES, LOCKSTEP_SAMPLES, context_kv_bytes

    h, B, k = dcfg.hidden_size, dcfg.block_size, len(dcfg.target_layer_ids)
    features = max_len * k * h * itemsize
    acts = max_len * h * ACTIVATION_ROWS * 4
    kv = context_kv_bytes(dcfg, max_len, itemsize)
    if positions == "walk":
        kv = max(kv, min(LOCKSTEP_BYTES, LOCKSTEP_SAMPLES * kv))
    chunk = block_chunk or auto_chunk(dcfg, max_len)
    rows = B if dcfg.num_layers > 1 else 1
    scores = chunk * 3 * 4 * rows * dcfg.num_heads * (min(max_len, CONTEXT_CHUNK) + B)
    blocks = chunk * B * (h + 2 * dcfg.num_kv_heads * dcfg.head_dim) * itemsize * 4
    head = 10 * dcfg.vocab_size * Drafts.rows_per_head(dcfg.vocab_size)
    return features + acts + kv + scores + blocks + head + KEPT_BYTES
