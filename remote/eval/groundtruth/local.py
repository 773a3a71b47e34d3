"""Generation with the target on this host (ground truth kind ``local``): greedy, or
sampled with each completion's own seed (`SeededSampler`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from remote.errors import UserError
from remote.httpclient import Waits


class LocalGenerator:
    """Greedy generation with the target on this host (transformers ``generate``, KV cache).

    `model`: the target already loaded (a job loads it once, `remote.eval.target`, and its
    engine then evaluates with that very model); its generation settings are read from the
    checkpoint as ``from_pretrained`` would. Without it the target is loaded here."""

    def __init__(self, target: str, dtype: str, threads: int | None, model=None):
        import torch

        self.target = target
        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        if model is not None:
            self.model = model
            self._generation_config(target)
            return
        from transformers import AutoModelForCausalLM

        try:
            self.model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype))
        except Exception as exc:
            raise UserError(
                f"cannot load the target {target} for local generation: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from None
        self.model.eval()

    def _generation_config(self, target: str) -> None:
        """The checkpoint's ``generation_config.json`` (its end-of-text ids, for one), as
        ``from_pretrained`` sets it; a model built from its config lacks it."""
        from transformers import GenerationConfig

        if Path(target, "generation_config.json").is_file():
            try:
                self.model.generation_config = GenerationConfig.from_pretrained(target)
            except Exception as exc:
                raise UserError(
                    f"cannot read {target}/generation_config.json: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                ) from None

    def generate_batch(
        self, prompts: list[list[int]], requests: list[dict], max_time: float | None = None
    ) -> list[list[int]]:
        """Completions of several prompts in ONE ``generate`` call, as a serving engine
        batches concurrent requests: left-padded, the padding masked out; `requests`: each
        one's sampling settings (`Prompts.requests`: greedy, or sampled with its seed, by
        `SeededSampler`). Each completion ends at its first end-of-text id, as alone it
        would. `max_time`: seconds after which ``generate`` stops early (its completions
        then cut short)."""
        from remote.eval import cpu_bf16

        torch = self.torch
        width = max(len(ids) for ids in prompts)
        config = self.model.generation_config
        eos = config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = config.pad_token_id if config.pad_token_id is not None else min(eos, default=0)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        first = requests[0]
        # greedy decoding picks the one token the sampler leaves finite: each row sampled
        # from its own generator, whatever else shares the batch
        sampler = (
            [SeededSampler(first, [r["seed"] for r in requests])] if first["temperature"] else []
        )
        with torch.inference_mode(), cpu_bf16.widened():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=first["max_new_tokens"],
                pad_token_id=pad,
                max_time=max_time,
                **({"logits_processor": sampler} if sampler else {}),
            )
        completions = []
        for row in out[:, width:].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            completions.append(row[:end])  # what follows a finished row is padding
        return completions

    def in_order(
        self,
        prompts: list[list[int]],
        requests: list[dict],
        batch: int,
        waits: Waits | None = None,
    ) -> Iterator[list[int]]:
        """Completions of `prompts`, yielded in order, generated `batch` prompts at a time;
        within the phase's deadline (`waits`), which ends a ``generate`` early and then
        the phase, in one line."""
        step = max(1, batch)
        for start in range(0, len(prompts), step):
            left = None if waits is None else waits.phase_end - time.monotonic()
            if left is not None and left <= 0:
                raise self._late(waits)
            part = slice(start, start + step)
            out = self.generate_batch(prompts[part], requests[part], left)
            if waits is not None and time.monotonic() >= waits.phase_end:
                raise self._late(waits)  # max_time may have cut it short
            yield from out

    def _late(self, waits: Waits) -> UserError:
        return UserError(
            f"local generation with {self.target} had not finished at {waits.phase_words()}"
        )


class SeededSampler:
    """A ``generate`` logits processor that samples each row's next token at the
    request's temperature, top-k and top-p (`remote.eval.logits.Processing`, as the
    engine processes the target) from that row's own generator (seeded with its
    completion's seed), and leaves only that token finite: greedy decoding then takes
    it. A completion is then the same in any batch, and the same as made alone."""

    def __init__(self, sampling: dict, seeds: list[int]):
        import torch

        from remote.eval.logits import Processing

        self.processing = Processing(sampling["temperature"], sampling["top_k"], sampling["top_p"])
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids, scores):
        import torch

        probs = torch.softmax(self.processing.scaled(scores), dim=-1).cpu()
        picked = [
            torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(self.generators)
        ]
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(len(picked)), torch.cat(picked).to(scores.device)] = 0.0
        return out
