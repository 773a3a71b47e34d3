"""Build and save tiny real targets: safetensors weights, config.json, generation_config.json
and a tokenizer (BPE trained with `tokenizers` on a built-in corpus, wrapped as a
``PreTrainedTokenizerFast`` with a simple chat template).

Random weights use transformers' default init; such tiny models fall into repetitive greedy
loops mixed with irregular stretches, which a tiny drafter learns quickly, so acceptance
rises visibly with training steps.
"""

from __future__ import annotations

import os
from typing import Any

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
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on `CORPUS`, with specials
    (``<|endoftext|>`` = eos/pad, ``<|mask|>`` for drafters) and a chat template."""
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


def _text_dims(
    vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int | None
) -> dict[str, Any]:
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )


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


def build_qwen3_target(
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
) -> str:
    """Save a tiny random ``Qwen3ForCausalLM`` (+ tokenizer) in ``out_dir``; returns the path.
    ``vocab_size`` is the tokenizer's BPE size; the model's vocabulary matches the tokenizer
    unless ``model_vocab_size`` pads it (as real models pad theirs; benchmarks use that to get
    a realistic embedding/head size)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer(vocab_size)
    torch.manual_seed(seed)
    vocab = max(len(tok), model_vocab_size or 0)
    cfg = Qwen3Config(
        **_text_dims(vocab, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size)
    )
    cfg.bos_token_id = cfg.pad_token_id = tok.pad_token_id
    return _save(Qwen3ForCausalLM(cfg).eval(), tok, out_dir, dtype)


def build_qwen35_vl_target(
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
) -> str:
    """Save a tiny random Qwen3.5-style ``Qwen3_5ForConditionalGeneration`` (vision tower +
    hybrid text stack: Gated DeltaNet linear-attention layers, every 4th full attention)."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tok = build_tokenizer(vocab_size)
    torch.manual_seed(seed)
    text = _text_dims(len(tok), hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size)
    text.update(
        layer_types=[
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)
        ],
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_conv_kernel_dim=4,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=hidden_size,
        patch_size=4,
        num_position_embeddings=16,
    )
    cfg = Qwen3_5Config(text_config=text, vision_config=vision)
    cfg.text_config.pad_token_id = tok.pad_token_id
    return _save(Qwen3_5ForConditionalGeneration(cfg).eval(), tok, out_dir, dtype)
