"""The engine's CPU kernels for Gated DeltaNet layers (`remote.eval.gated_delta`, put in
place by `remote.eval.linear_attention`) against transformers' reference implementation:

- the chunked gated delta rule equals ``torch_chunk_gated_delta_rule`` to float32 rounding
  (grouped value heads, sequences that do not fill their last chunk, a given initial
  state, the final state), and to bf16 rounding on bf16 inputs; the causal convolution
  equals ``causal_conv1d_fn`` bit for bit;
- a target loaded by the engine runs them in every linear-attention layer (qwen3_5,
  qwen3_next, qwen3_5_moe), each layer's output within bf16 rounding of the same target
  run by transformers' own kernels (``DFLASH_LINEAR_ATTENTION=transformers``), measured
  as ``dflash parity`` measures it; a model transformers loads beside it keeps its own;
- a drafter trained on each of those targets walks the same chain and DDTree rounds in
  float32 with either kernel.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as reference

from orchestrator.demo.architectures import save_tiny
from remote.errors import UserError
from remote.eval import gated_delta, linear_attention
from remote.eval.parity import layer_errors
from remote.eval.target import load_target

torch.set_num_threads(1)


def inputs(t: int, dtype: torch.dtype, seed: int = 0, hk: int = 2, hv: int = 6, d: int = 16):
    """Random (query, key, value, g, beta) as a Gated DeltaNet layer hands them over."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, t, hk, d, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(1, t, hv, d, generator=gen).to(dtype)
    g = -torch.rand(1, t, hv, generator=gen) * 3  # log decays, float32 as the layer's
    beta = torch.rand(1, t, hv, generator=gen).to(dtype)
    return q, k, v, g, beta


@pytest.mark.parametrize("t", [1, 7, 64, 150])
def test_the_delta_rule_equals_the_reference_in_float32(t):
    q, k, v, g, beta = inputs(t, torch.float32)
    state = torch.randn(1, 6, 16, 16, generator=torch.Generator().manual_seed(3)) * 0.3
    for kw in ({}, {"initial_state": state, "output_final_state": True}):
        want, want_state = reference.torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, **kw
        )
        got, got_state = gated_delta.chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, **kw
        )
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        if kw:
            torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-6)
        else:
            assert got_state is None


def test_the_delta_rule_is_within_bf16_rounding_on_bf16_inputs():
    q, k, v, g, beta = inputs(200, torch.bfloat16, seed=1)
    want, _ = reference.torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True
    )
    got, _ = gated_delta.chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True
    )
    assert got.dtype == torch.bfloat16
    # both round one float32 result to bf16: at most one bf16 step apart, rarely that
    step = want.float().abs().clamp_min(1e-3) * 2**-7
    assert bool(((got.float() - want.float()).abs() <= step).all())
    assert (got != want).float().mean() < 0.01


def test_the_wy_inverse_is_the_inverse():
    low = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(2)).tril(-1) * 0.2
    for c in (5, 16, 24, 64):
        part = low[:, :c, :c]
        eye = torch.eye(c)
        torch.testing.assert_close(
            gated_delta.unit_lower_inverse(part) @ (eye + part),
            eye.expand(3, c, c),
            atol=1e-5,
            rtol=0,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_convolution_equals_the_reference_to_rounding(dtype):
    gen = torch.Generator().manual_seed(4)
    xt = torch.randn(2, 37, 24, generator=gen).to(dtype).transpose(1, 2)  # as the layer has it
    w, bias = torch.randn(24, 4, generator=gen).to(dtype), torch.randn(24).to(dtype)
    # and a channel-major input (a cache's state prepended)
    for act, b, x in (("silu", None, xt), (None, bias, xt), ("silu", None, xt.contiguous())):
        want = reference.causal_conv1d_fn(x, w, b, activation=act)
        got = gated_delta.causal_conv1d_fn(x, w, b, activation=act)
        assert got.dtype == want.dtype and got.shape == want.shape
        # the same products summed in another order: float32 rounding, or the same bf16
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        else:
            assert torch.equal(got, want)


def capture(folder, dtype) -> tuple[str | None, tuple[torch.Tensor, ...]]:
    """(the target's linear-attention kernels, every layer's output) over fixed ids."""
    target = load_target(str(folder), dtype)
    ids = torch.randint(0, 150, (90,), generator=torch.Generator().manual_seed(5)).tolist()
    feats, _ = target.hidden(ids, list(range(target.info.num_layers)))
    return target.linear_attention, feats.split(target.info.hidden_size, dim=-1)


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next", "qwen3_5_moe"])
def test_every_linear_attention_layer_runs_them_within_bf16_rounding(name, tmp_path, monkeypatch):
    folder = save_tiny(name, tmp_path / name)
    got = {}
    for choice in (linear_attention.OWN, linear_attention.THEIRS):
        monkeypatch.setenv(linear_attention.ENV, choice)
        for dtype in (torch.float32, torch.bfloat16):
            kind, got[(choice, dtype)] = capture(folder, dtype)
            assert kind == choice

    def worst(dtype) -> list[float]:
        theirs, ours = got[(linear_attention.THEIRS, dtype)], got[(linear_attention.OWN, dtype)]
        pairs = zip(theirs, ours, strict=True)
        return [float(layer_errors(a, b)["rel_l2"].max()) for a, b in pairs]

    # another kernel: float32 rounding apart, from the first linear-attention layer on
    assert 0 < max(worst(torch.float32)) < 1e-5, worst(torch.float32)
    # bf16 keeps 8 bits: a layer's own rounding is ~4e-3 relative
    assert max(worst(torch.bfloat16)) < 2e-2, worst(torch.bfloat16)


def test_a_model_loaded_beside_keeps_transformers_kernels(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = save_tiny("qwen3_next", tmp_path / "m")
    target = load_target(str(folder), torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert target.linear_attention == linear_attention.OWN
    assert linear_attention.kind(plain) == linear_attention.THEIRS
    assert (
        linear_attention.kind(
            load_target(str(save_tiny("qwen3", tmp_path / "q")), torch.float32).backbone
        )
        is None
    )


def test_an_unknown_choice_is_one_line(tmp_path, monkeypatch):
    folder = save_tiny("qwen3_5", tmp_path / "m")
    monkeypatch.setenv(linear_attention.ENV, "fla")
    with pytest.raises(UserError, match="DFLASH_LINEAR_ATTENTION='fla' is not supported"):
        load_target(str(folder), torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next", "qwen3_5_moe"])
def test_the_rounds_of_a_trained_pair_are_unchanged_in_float32(name, tmp_path, monkeypatch):
    """A drafter trained on the target makes rounds of several tokens; the walk's chain and
    DDTree rounds in float32 are the same with either kernel."""
    from orchestrator.demo.train import make_ground_truth, train_drafter
    from remote.eval.drafter import load_drafter
    from remote.eval.walk import WalkOptions, eval_batch

    folder = str(save_tiny(name, tmp_path / name))
    rows = make_ground_truth(folder, 6, prompt_len=10, completion_len=24, seed=1)
    step = train_drafter(
        folder, str(tmp_path / "d"), save_steps=(120,), rows=rows, batch_samples=4
    )[0]
    drafter, _ = load_drafter(step, torch.float32)
    samples = [(r["prompt_ids"], r["completion_ids"]) for r in rows]
    got = {}
    for choice in (linear_attention.OWN, linear_attention.THEIRS):
        monkeypatch.setenv(linear_attention.ENV, choice)
        target = load_target(folder, torch.float32)
        assert target.linear_attention == choice
        recs = eval_batch(target, drafter, samples, WalkOptions(budgets=[4, 16]))
        got[choice] = [(r["rounds"], r["ddtree"]) for r in recs]
    assert got[linear_attention.OWN] == got[linear_attention.THEIRS]
    assert max(max(rounds) for rounds, _t in got[linear_attention.OWN]) > 2  # not all misses
