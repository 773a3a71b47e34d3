"""The eval engine reads the text part of every architecture the probe understands.

One tiny checkpoint per architecture of `orchestrator.demo.architectures` (real config
class, 2-4 layers, hidden 32, saved with ``save_pretrained``), and for each:

- the engine's raw output of every decoder layer i < n-1 equals transformers' own
  ``hidden_states[i+1]`` from the model ``from_pretrained`` loads (the last entry is
  final-normed in 5.x, so the last layer is compared through the final norm);
- its greedy tokens equal the argmax of transformers' logits, in float32;
- the probe's layers path, layer count and head path are the ones the engine uses.

The reference is the checkpoint's own class run as transformers runs it. Llama4's wrapper
cannot run text-only input in transformers 5.24 (its forward reads ``image_outputs`` from
the text model's output); its reference is the wrapper's own text model
(``language_model``, a ``Llama4ForCausalLM``), which is what the wrapper calls.
"""

from __future__ import annotations

import json

import pytest
import torch

from orchestrator.demo.architectures import (
    ARCHITECTURES,
    Dims,
    gemma3n_text_config,
    resolve,
    save_tiny,
)
from remote.errors import UserError
from remote.eval.target import first_row, load_target
from remote.probe.structure import probe
from tests.helpers.architectures import FUSED_ON_LOAD, LAYERS_PATH

torch.set_num_threads(1)

REFERENCE_PART = {"llama4": "language_model"}
# Wrappers whose own text-only forward differs from their own text model by float32
# rounding (PaliGemma passes an explicit prefix mask, which takes another SDPA path: up to
# 1.5e-8 here). The engine equals the text model exactly; against the wrapper, to 1e-6.
# Targets with linear-attention layers differ by float32 rounding too: the engine runs its
# own chunked kernel there (`remote.eval.gated_delta`), transformers its reference one.
WRAPPER_ROUNDING = {"paligemma"}


def reference(name: str, folder):
    """The checkpoint loaded by transformers itself (``from_pretrained``), float32."""
    import transformers

    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, arch).from_pretrained(str(folder), dtype=torch.float32).eval()
    part = REFERENCE_PART.get(name)
    return model.get_submodule(part) if part else model


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_engine_equals_transformers_and_agrees_with_the_probe(name, tmp_path):
    folder = save_tiny(name, tmp_path / name)
    layers_path, count = LAYERS_PATH[name], ARCHITECTURES[name].layers
    report = probe(str(folder))
    target = load_target(str(folder), torch.float32)
    info = target.info
    # the probe and the engine: one finder, one answer
    assert report["text"]["layers"] == info.layers_path == layers_path
    assert report["text"]["num_layers"] == info.num_layers == count
    assert report["text"]["lm_head"] == info.head_path is not None
    assert report["keys"]["text_complete"], report["keys"]["missing_text"]
    assert bool(report["keys"]["needs_conversion"]["count"]) is (name in FUSED_ON_LOAD)
    # never the vision tower
    loaded = [k for k, p in target.model.named_parameters() if not p.is_meta]
    assert loaded and all(info.in_text(k) for k in loaded)

    ids = torch.randint(0, Dims().vocab - 8, (24,), generator=torch.Generator().manual_seed(1))
    feats, greedy = target.forward(ids.tolist(), list(range(count)))
    ref = reference(name, folder)
    with torch.inference_mode():
        out = ref(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    H = info.hidden_size
    for i in range(count - 1):
        got, want = feats[:, i * H : (i + 1) * H], first_row(out.hidden_states[i + 1])
        if name in WRAPPER_ROUNDING or target.linear_attention == "cpu-chunked":
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        else:
            assert torch.equal(got, want), i
    # The last entry is the final-normed output in 5.x (raw where a model says so: Gemma3n).
    last, want = feats[:, (count - 1) * H :], first_row(out.hidden_states[count])
    if not torch.equal(last, want):
        torch.testing.assert_close(target.model.get_submodule(info.norm_path)(last), want)
    assert greedy.tolist() == out.logits[0].float().argmax(-1).tolist()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_ends_alone_are_the_whole_target_s_embedding_and_head(name, tmp_path):
    """`ends_only` (an eval whose features are all cached): the embedding and head equal
    the whole load's, nothing else is read, the target refuses a forward, and
    `load_layers` makes it the whole target."""
    folder = save_tiny(name, tmp_path / name)
    whole = load_target(str(folder), torch.float32)
    ends = load_target(str(folder), torch.float32, ends_only=True)
    assert not ends.whole and whole.whole
    assert torch.equal(ends.embed, whole.embed) and torch.equal(ends.lm_head, whole.lm_head)
    loaded = [k for k, p in ends.model.named_parameters() if not p.is_meta]
    assert loaded and all(ends.info.in_ends(k) for k in loaded), loaded
    assert any(p.is_meta for p in ends.layers.parameters())
    with pytest.raises(RuntimeError, match="without its layers"):
        ends.forward([3, 4, 5], [0])
    ends.load_layers()
    ids = list(range(3, 20))
    got, want = ends.forward(ids, [0]), whole.forward(ids, [0])
    assert ends.whole and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_model_transformers_cannot_build_here_is_one_line_naming_it(tmp_path):
    """Gemma3n's full model builds its vision tower with timm; without timm on the host the
    eval says so in one line naming the architecture, before reading any weight."""
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed here: Gemma3nForConditionalGeneration builds")
    from transformers import Gemma3nConfig

    folder = tmp_path / "gemma3n-vlm"
    folder.mkdir()
    cfg = Gemma3nConfig(text_config=gemma3n_text_config(resolve("gemma3n")))
    cfg.architectures = ["Gemma3nForConditionalGeneration"]
    cfg.save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as err:
        load_target(str(folder), torch.float32)
    msg = str(err.value)
    assert "\n" not in msg and "Gemma3nForConditionalGeneration" in msg and "timm" in msg


def test_a_quantized_checkpoint_is_one_line(tmp_path):
    """gpt-oss ships MXFP4 experts; the loader does not dequantize, and says so up front."""
    folder = save_tiny("gpt_oss", tmp_path / "gpt_oss")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError) as err:
        load_target(str(folder), torch.float32)
    msg = str(err.value)
    assert "\n" not in msg and "GptOssForCausalLM" in msg and "quantized (mxfp4)" in msg
