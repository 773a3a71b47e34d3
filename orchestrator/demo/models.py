"""Build and save tiny real targets (weights, configs, trained BPE tokenizer)."""

from __future__ import annotations

import functools
import os

from orchestrator.demo.architectures import Dims, tiny_model

CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "Speculative decoding drafts several tokens and lets the target verify them at once.",
    "A drafter proposes a block of tokens; the target accepts the longest matching prefix.",
    "Numbers like 1 2 3 4 5 6 7 8 9 10 and words like alpha beta gamma delta appear often.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "User: what is the capital of France?\nAssistant: The capital of France is Paris.",
    "Block diffusion predicts all masked positions in parallel from the verified context.",
    "Memory bandwidth, not arithmetic, bounds decoding speed on large language models.",
    "She sells sea shells by the sea shore, and the shells she sells are sea shells.",
    "Tests use real parts: real checkpoints, real tokenizers, real forward passes.",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MASK_TOKEN = "<|mask|>"


def build_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer on `CORPUS` with eos/pad, mask and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", MASK_TOKEN],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _save(model, tokenizer, out_dir: str, dtype: str) -> str:
    import torch
    from transformers import GenerationConfig

    os.makedirs(out_dir, exist_ok=True)
    model = model.to(getattr(torch, dtype))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_target(
    kind: str,
    out_dir: str,
    *,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 320,
    seed: int = 0,
    dtype: str = "float32",
    model_vocab_size: int | None = None,
    max_positions: int = 32768,  # covers a 16k context ladder (docs/context.md)
) -> str:
    """Save a tiny random `kind` target and tokenizer in ``out_dir`` (padded vocabulary, window)."""
    tok = build_tokenizer(vocab_size)
    dims = Dims(
        hidden=hidden_size,
        layers=num_layers,
        heads=num_heads,
        kv_heads=num_kv_heads,
        intermediate=intermediate_size,
        vocab=max(len(tok), model_vocab_size or 0),
        max_positions=max_positions,
    )
    ids = {"pad_token_id": tok.pad_token_id}
    if kind == "qwen3":  # its config names a bos token too: the pad token here
        ids["bos_token_id"] = tok.pad_token_id
    return _save(tiny_model(kind, dims, seed, **ids), tok, out_dir, dtype)


# a Qwen3 text model and a Qwen3.5-style vision-language model (hybrid Gated DeltaNet stack)
build_qwen3_target = functools.partial(build_target, "qwen3")
build_qwen35_vl_target = functools.partial(build_target, "qwen3_5")
