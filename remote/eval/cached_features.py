"""The features a walk reads for each sample: the feature cache's entry, else the target's
forward, kept in the cache then (`Features`)."""

from __future__ import annotations

import torch

from remote.eval.feature_cache import RunCache


class Features:
    """The ``given`` of `remote.eval.walk.eval_stream` for ``samples``: sample `n`'s
    (features, greedy) from the cache when it holds them, else from the target's forward
    (then kept in the cache; `RunCache.final` entries: the final rows third). One sample's
    tensors at a time, when it joins the walk, so memory stays what its forward takes."""

    def __init__(self, cache: RunCache, target, layer_ids: list[int], samples, device):
        self.cache, self.target, self.layer_ids = cache, target, layer_ids
        self.samples, self.device = samples, device

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        from remote.eval import device as device_mod

        prompt, completion = self.samples[n]
        hit = self.cache.lookup(prompt, completion, self.target.dtype)
        if hit is not None:
            return tuple(t.to(self.device) for t in hit)
        if not self.target.whole:  # its entry was there before the load, and is no longer whole
            self.cache.warnings.append(
                f"a feature cache entry in {self.cache.where} failed its check after the "
                "eval began; the target's layers were loaded to compute it"
            )
            self.target.load_layers()
            device_mod.place(self.target, None, self.device)
        g = list(prompt) + list(completion)
        got = self.target.forward(
            g, self.layer_ids, argmax_from=len(prompt) - 1, final=self.cache.final
        )
        self.cache.store(prompt, completion, *got)
        return got

    def again(self, n: int) -> tuple[torch.Tensor, ...]:
        """Sample `n`'s tensors again (a sampled eval's second pass), counting nothing."""
        counts = (self.cache.hits, self.cache.stored, self.cache.not_stored)
        try:
            return self[n]
        finally:
            self.cache.hits, self.cache.stored, self.cache.not_stored = counts
