"""The job document (``dflash.job/1``) beyond its engine settings: what a parity capture
sets (the attention implementation, the logits' top-k)."""

from __future__ import annotations

from remote.protocol.values import one_of

# The attention implementations a parity capture may run the target with (None:
# transformers' default for the architecture).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
ATTN = one_of(*ATTN_IMPLEMENTATIONS)
CAPTURE_TOPK = 8  # logits kept per token by a parity capture
