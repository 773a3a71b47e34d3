"""Next-token distributions as a serving engine samples them: temperature, then top-k,
then top-p (vLLM's `apply_sampling_constraints` order, z-lab's and transformers' too),
in float32: the target's distributions the offline expectation reads
(`remote.eval.sampled`), and local sampled generation's.

torch is imported at module import: import this module lazily.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Processing:
    """Temperature (> 0), top-k (None: off) and top-p (None or 1: off) of the engine."""

    temperature: float
    top_k: int | None = None
    top_p: float | None = None

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits over the temperature, with what top-k and top-p cut set to -inf."""
        x = logits.float() / self.temperature
        vocab = x.shape[-1]
        if self.top_k is not None and self.top_k < vocab:
            kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            ordered, order = torch.sort(x, dim=-1, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            # keep the smallest prefix whose mass reaches top_p (the first token always)
            drop = (probs.cumsum(-1) - probs) >= self.top_p
            drop[..., 0] = False
            x = x.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        return x

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed log-probabilities (float32, -inf where cut), row by row."""
        return torch.log_softmax(self.scaled(logits), dim=-1)
