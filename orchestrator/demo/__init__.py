"""Tiny real models for tests and the embedded demo.

`models` builds and saves tiny random-weight targets (a Qwen3 text model and a Qwen3.5-style
vision-language model, each with a real tokenizer); `train` trains a tiny DFlash drafter on a
target's own greedy outputs. Both import torch/transformers lazily: importing this package
stays cheap on a controller without torch.
"""
