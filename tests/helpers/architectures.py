"""What a correct probe and loader must find in each tiny architecture of
`orchestrator.demo.architectures`: test data written by hand from the transformers source,
not something the probe reads.
"""

from __future__ import annotations

# The decoder layers' path in the class each checkpoint names.
_BY_PATH = {
    "model.layers": "qwen3 qwen3_moe qwen3_next llama gemma3_text gemma3n gpt_oss",
    "model.language_model.layers": (
        "qwen3_5 qwen3_5_moe qwen3_vl qwen3_vl_moe qwen2_5_vl mistral3 gemma3 paligemma llava"
        " internvl"
    ),
    "model.text_model.layers": "idefics3 smolvlm",
    "language_model.model.layers": "llama4",
}
LAYERS_PATH = {name: path for path, names in _BY_PATH.items() for name in names.split()}

# Checkpoints with a vision tower: all but the text-only classes.
VLM = set(LAYERS_PATH) - set(_BY_PATH["model.layers"].split())

# MoE checkpoints storing one key per expert, which transformers fuses on load (Llama4 and
# gpt-oss store their experts fused already).
FUSED_ON_LOAD = {"qwen3_moe", "qwen3_5_moe", "qwen3_next", "qwen3_vl_moe"}
