"""The text-only target loader on real checkpoint layouts: legacy VLM key names and shards,
tied heads. Each variant must give the same features and greedy tokens as the original."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from remote.eval.target import load_target


def test_legacy_vlm_keys_in_shards_load_like_the_original(tmp_path):
    # The legacy Llava-family layout (language_model.model.*, language_model.lm_head) is
    # renamed by transformers' own conversion mapping for Gemma3; the loader follows it.
    from orchestrator.demo.architectures import save_tiny

    orig = str(save_tiny("gemma3", tmp_path / "orig"))
    ref = load_target(orig, torch.float32)
    g = list(range(3, 40))
    n = ref.info.num_layers
    want_f, want_g = ref.forward(g, [0, n - 1])
    state = load_file(os.path.join(orig, "model.safetensors"))
    legacy = {}
    for key, t in state.items():
        for new, old in (
            ("language_model.model.", "model.language_model."),
            ("language_model.lm_head.", "lm_head."),
            ("vision_tower.", "model.vision_tower."),
            ("multi_modal_projector.", "model.multi_modal_projector."),
        ):
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        legacy[key] = t
    assert any(k.startswith("language_model.model.layers.") for k in legacy)
    d = tmp_path / "legacy"
    d.mkdir()
    for name in os.listdir(orig):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(orig, name), d / name)
    keys = sorted(legacy)
    shards = {
        "model-00001-of-00002.safetensors": keys[: len(keys) // 2],
        "model-00002-of-00002.safetensors": keys[len(keys) // 2 :],
    }
    for shard, ks in shards.items():
        save_file({kk: legacy[kk] for kk in ks}, str(d / shard))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {kk: s for s, ks in shards.items() for kk in ks}})
    )
    got = load_target(str(d), torch.float32)
    assert got.info.backbone_path == "model.language_model" and got.info.head_path == "lm_head"
    assert got.info.tied_head and got.lm_head.data_ptr() == got.embed.data_ptr()
    f, gr = got.forward(g, [0, n - 1])
    assert torch.equal(f, want_f) and torch.equal(gr, want_g)


def test_tied_head_target(tmp_path):
    from transformers import AutoModelForCausalLM

    from orchestrator.demo.models import build_qwen3_target

    path = str(tmp_path / "tied")
    build_qwen3_target(path, hidden_size=32, num_layers=2)
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    cfg["tie_word_embeddings"] = True
    open(os.path.join(path, "config.json"), "w").write(json.dumps(cfg))
    state = load_file(os.path.join(path, "model.safetensors"))
    del state["lm_head.weight"]  # a tied checkpoint stores the embedding only
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t = load_target(path, torch.float32)
    assert t.info.tied_head and t.lm_head.data_ptr() == t.embed.data_ptr()
    ids = list(range(5, 30))
    _f, greedy = t.forward(ids, [0])
    with torch.inference_mode():
        assert greedy.tolist() == hf(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()


def test_transformers_quiet_gives_back_what_it_found():
    from transformers.utils import logging as hf_logging

    from remote.model.quiet import transformers_quiet

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_info()
    hf_logging.enable_progress_bar()
    try:
        with transformers_quiet():
            assert hf_logging.get_verbosity() == hf_logging.ERROR
            assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.get_verbosity() == hf_logging.INFO
        assert hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.set_verbosity(verbosity)
        if not bars:
            hf_logging.disable_progress_bar()


def test_describing_a_model_leaves_transformers_logging_as_it_was(tmp_path):
    # A library call must not silence transformers for the rest of the process: an eval
    # host's job log keeps the warnings of what runs after (a kernel's slow fallback).
    from transformers.utils import logging as hf_logging

    from orchestrator.demo.architectures import save_tiny
    from remote.model.layout import describe

    folder = save_tiny("qwen3", tmp_path / "target")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    try:
        d = describe(folder)
        assert d.layout.layers_path
        assert hf_logging.get_verbosity() == hf_logging.WARNING
    finally:
        hf_logging.set_verbosity(verbosity)


def _mapped_ranges(path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of the file at `path`."""
    out = []
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(str(path)):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            out.append((start, end))
    return out


def test_weights_kept_as_stored_are_the_files_mapped_never_written(tmp_path):
    import hashlib

    from orchestrator.demo.architectures import tiny_model
    from remote.eval.target import load_target

    name = tmp_path / "m"
    tiny_model("qwen3_5_moe", seed=0).to(torch.bfloat16).save_pretrained(name)
    shard = name / "model.safetensors"
    before = hashlib.sha256(shard.read_bytes()).hexdigest()
    target = load_target(str(name), torch.bfloat16)
    ranges = _mapped_ranges(shard)
    assert ranges

    def mapped(t: torch.Tensor) -> bool:
        return any(a <= t.data_ptr() < b for a, b in ranges)

    loaded = {k: p for k, p in target.model.named_parameters() if not p.is_meta}
    views = {k for k, p in loaded.items() if mapped(p)}
    # every weight but the experts, which transformers fuses from per-expert keys (read)
    assert views and all("experts" in k for k in set(loaded) - views), set(loaded) - views
    assert target.forward(list(range(12)), [0])[1].numel() == 12
    with torch.no_grad():  # a write stays in this process (copy on write)
        next(iter(loaded[k] for k in views)).add_(1)
    assert hashlib.sha256(shard.read_bytes()).hexdigest() == before
    # another dtype converts every weight: nothing stays mapped
    del target, loaded
    target = load_target(str(name), torch.float32)
    assert not any(
        any(a <= p.data_ptr() < b for a, b in _mapped_ranges(shard))
        for p in target.model.parameters()
        if not p.is_meta
    )
