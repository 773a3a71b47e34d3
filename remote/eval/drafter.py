"""The DFlash drafter in plain PyTorch: config, checkpoint loading, forward.

Readable top to bottom. A drafter has no embedding and no LM head: it borrows the target's.
For a block starting at position ``s`` (the last verified token ``g[s]`` followed by ``B-1``
mask tokens) every drafter layer attends from the block to
``concat(context, block)`` where context = ``hidden_norm(fc(target features at < s))``, with
the SAME k/v projections for both; attention is not causal (unless the config says so for a
sliding layer, as z-lab does). The reference is z-lab's own implementation,
https://github.com/z-lab/dflash/blob/main/dflash/model.py.

Two forwards are offered and must agree:

* `DFlashDrafter.forward_block`: one block, context K/V recomputed - the straightforward
  online form (used by the tests' online oracle).
* `DFlashDrafter.context_kv` + `DFlashDrafter.forward_blocks`: context K/V of every layer
  computed ONCE per sequence, then any number of blocks batched in one SDPA call per layer
  with an explicit mask (block b sees context positions < s_b and only its own block). This
  is what the offline eval uses.

torch and transformers are imported at module import: import this module lazily.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from remote.errors import UserError
from remote.model.drafter_format import default_target_layer_ids, normalise_key  # noqa: F401 (re-exported)
from remote.model.drafter_format import read_state as _read_state
from remote.model.drafter_format import weight_files as _weight_files
from remote.model.drafter_format import weight_shapes as weight_shapes

# Keys some trainers save beside the drafter that are not drafter weights: the borrowed
# target embedding / head and derived rotary buffers. They are skipped, and reported.
IGNORABLE_KEYS = ("embed_tokens.weight", "lm_head.weight", "rotary_emb.inv_freq")

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # one sequence's (K, V) of each layer


@dataclass
class DrafterConfig:
    """The fields of a z-lab drafter ``config.json`` the forward needs."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    mask_token_id: int | None
    target_layer_ids: list[int] | None
    num_target_layers: int | None
    layer_types: list[str]
    sliding_window: int | None
    is_causal: bool | None
    attention_bias: bool
    hidden_act: str
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], num_target_layers: int | None = None) -> DrafterConfig:
        """Parse a config dict; ``num_target_layers`` fills the default layer ids if absent."""
        dcfg = d.get("dflash_config") or {}

        def pick(name: str, default: Any = None) -> Any:
            # z-lab reads dflash_config first, then the top level.
            return dcfg.get(name, d.get(name, default))

        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            layers = int(d["num_hidden_layers"])
            cfg = cls(
                hidden_size=hidden,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                intermediate_size=int(d["intermediate_size"]),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                vocab_size=int(d["vocab_size"]),
                block_size=int(pick("block_size", 16)),
                mask_token_id=pick("mask_token_id"),
                target_layer_ids=pick("target_layer_ids"),
                num_target_layers=pick("num_target_layers", num_target_layers),
                layer_types=list(d.get("layer_types") or ["full_attention"] * layers),
                sliding_window=d.get("sliding_window"),
                is_causal=d.get("is_causal"),
                attention_bias=bool(d.get("attention_bias", False)),
                hidden_act=str(d.get("hidden_act", "silu")),
                input_embedding_scale=float(pick("input_embedding_scale", 1.0)),
                output_multiplier=float(pick("output_multiplier", 1.0)),
                final_logit_softcapping=pick("final_logit_softcapping"),
                raw=d,
            )
        except KeyError as exc:
            raise UserError(
                f"drafter config.json lacks {exc.args[0]!r}; is this a DFlash drafter config?"
            ) from None
        if num_target_layers is not None:
            cfg.num_target_layers = (
                int(num_target_layers) if cfg.num_target_layers is None else cfg.num_target_layers
            )
        if cfg.target_layer_ids is None:
            if cfg.num_target_layers is None:
                raise UserError(
                    "drafter config has no target_layer_ids "
                    "and no num_target_layers; add one of them"
                )
            cfg.target_layer_ids = default_target_layer_ids(
                int(cfg.num_target_layers), cfg.num_layers
            )
        cfg.target_layer_ids = [int(i) for i in cfg.target_layer_ids]
        if cfg.mask_token_id is None:
            raise UserError(
                "drafter config has no dflash_config.mask_token_id; "
                "add the mask token id used in training"
            )
        cfg.mask_token_id = int(cfg.mask_token_id)
        if len(cfg.layer_types) != layers:
            raise UserError(
                f"drafter config layer_types has {len(cfg.layer_types)} entries for {layers} layers"
            )
        if heads % cfg.num_kv_heads:
            raise UserError(
                f"drafter num_attention_heads {heads} is not a "
                f"multiple of num_key_value_heads {cfg.num_kv_heads}"
            )
        return cfg

    def layer_attention(self, i: int) -> tuple[bool, int | None]:
        """(is_causal, sliding_window) of drafter layer ``i``, following z-lab's rule."""
        sliding = self.layer_types[i] == "sliding_attention"
        causal = sliding if self.is_causal is None else bool(self.is_causal)
        return causal, (int(self.sliding_window) if sliding and self.sliding_window else None)


def read_config(path: str, num_target_layers: int | None = None) -> DrafterConfig:
    """Read the drafter's ``config.json`` (``path`` is the checkpoint folder or a weights file)."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise UserError(
            f"no config.json beside the drafter weights in {folder}; copy the training config there"
        )
    with open(cfg_path) as fh:
        return DrafterConfig.from_dict(json.load(fh), num_target_layers)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalise in float32, cast back, then scale (same op order as HF)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x`` [..., heads, seq, head_dim]; cos/sin [seq, rot]; partial rotary allowed."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)


class Rotary(nn.Module):
    """cos/sin for absolute positions, from transformers' own RoPE helpers (so every
    ``rope_parameters`` / ``rope_scaling`` variant transformers knows is honoured)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        keep = {
            k: v
            for k, v in cfg.raw.items()
            if k not in ("dflash_config", "architectures", "auto_map")
        }
        try:
            hf_cfg = Qwen3Config(**keep)
            rope = Qwen3RotaryEmbedding(hf_cfg)
        except Exception as exc:  # transformers validates rope settings itself
            raise UserError(
                f"drafter rope settings are not understood by transformers: {exc}"
            ) from None
        self.register_buffer("inv_freq", rope.inv_freq.detach().clone().float(), persistent=False)
        self.attention_scaling = float(rope.attention_scaling)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # cast like HF does, so bf16 rounding matches the trainer's
        return (emb.cos() * self.attention_scaling).to(dtype), (
            emb.sin() * self.attention_scaling
        ).to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig, idx: int):
        super().__init__()
        d, h, kv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.head_dim, self.num_heads, self.num_kv_heads = d, h, kv
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.is_causal, self.sliding_window = cfg.layer_attention(idx)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """q-normed queries of rows ``x`` [..., hidden] -> [..., heads, head_dim], before RoPE."""
        return self.q_norm(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)))

    def raw_keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k-normed keys and values of rows ``x`` [..., hidden] -> [..., kv_heads, head_dim],
        before RoPE (so rows with equal inputs can share them)."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)))
        return k, self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of context rows ``x`` [n, hidden] -> [kv_heads, n, head_dim]."""
        k, v = self.raw_keys_values(x)
        return apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Position-only visibility [..., q, k] (causal / sliding window, z-lab's rule) of
        broadcastable positions ``q_pos`` [..., q] and ``k_pos`` [..., k]; None = all."""
        if not self.is_causal and self.sliding_window is None:
            return None
        qp, kp = q_pos[..., :, None], k_pos[..., None, :]
        ok = torch.ones(
            torch.broadcast_shapes(qp.shape, kp.shape), dtype=torch.bool, device=q_pos.device
        )
        if self.is_causal:
            ok &= kp <= qp
        if self.sliding_window is not None:
            ok &= (qp - kp) < self.sliding_window
            if not self.is_causal:
                ok &= (kp - qp) < self.sliding_window
        return ok

    def attend(
        self,
        q: torch.Tensor,
        q_pos: torch.Tensor,
        starts: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        blk_k: torch.Tensor,
        blk_v: torch.Tensor,
        blk_pos: torch.Tensor,
    ) -> torch.Tensor:
        """Attention of ``R`` query rows per block to that block's context and its own rows.

        ``q`` [nb, R, heads, d] (roped), ``q_pos`` [nb, R]; block ``n`` sees context
        positions ``< starts[n]`` of ``ctx_k``/``ctx_v`` [kv_heads, C, d] and its own keys
        ``blk_k``/``blk_v`` [nb, B, kv_heads, d] at ``blk_pos`` [nb, B]. Scores and softmax
        are float32; the cost is ``R x (C + B)`` per block, never the ``(nb*B)^2`` of one
        masked sequence holding every block. Returns ``o_proj`` of the result [nb, R, hidden].
        """
        return self.o_proj(self.mix(q, q_pos, starts, ctx_k, ctx_v, blk_k, blk_v, blk_pos))

    def mix(
        self,
        q: torch.Tensor,
        q_pos: torch.Tensor,
        starts: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        blk_k: torch.Tensor,
        blk_v: torch.Tensor,
        blk_pos: torch.Tensor,
    ) -> torch.Tensor:
        """`attend` before its output projection: the heads' mixed values [nb, R, heads*d]
        (so blocks of several sequences, mixed one sequence at a time, share one
        ``o_proj``)."""
        nb, R, H, d = q.shape
        C, kvh = ctx_k.shape[1], self.num_kv_heads
        qf = q.float().view(nb, R, kvh, H // kvh, d) * d**-0.5
        s_ctx = torch.einsum("nrkgd,kcd->nrkgc", qf, ctx_k.float())
        s_blk = torch.einsum("nrkgd,nbkd->nrkgb", qf, blk_k.float())
        ctx_ok = torch.arange(C)[None, None, :] < starts[:, None, None]  # [nb, 1, C]
        vis = self.visible(q_pos, torch.arange(C))
        ctx_ok = ctx_ok if vis is None else ctx_ok & vis
        blk_ok = self.visible(q_pos, blk_pos)
        scores = torch.cat(
            (
                s_ctx.masked_fill(~ctx_ok[:, :, None, None, :], float("-inf")),
                s_blk
                if blk_ok is None
                else s_blk.masked_fill(~blk_ok[:, :, None, None, :], float("-inf")),
            ),
            -1,
        )
        p = torch.softmax(scores, dim=-1)
        out = torch.einsum("nrkgc,kcd->nrkgd", p[..., :C], ctx_v.float()) + torch.einsum(
            "nrkgb,nbkd->nrkgd", p[..., C:], blk_v.float()
        )
        return out.reshape(nb, R, H * d).to(q.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DrafterConfig, idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# ---------------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------------


class DFlashDrafter(nn.Module):
    """A z-lab DFlash drafter. Weight names match z-lab's checkpoints exactly."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_layers))
        self.fc = nn.Linear(
            len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False
        )
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def mask_token_id(self) -> int:
        return int(self.cfg.mask_token_id)

    def block_inputs(self, embed: torch.Tensor, first_tokens: torch.Tensor) -> torch.Tensor:
        """Block input embeddings [nb, B, hidden]: ``[token, mask, ..., mask]`` per block,
        looked up in the target's embedding matrix ``embed`` [vocab, hidden]."""
        ids = torch.full(
            (first_tokens.shape[0], self.block_size), self.mask_token_id, dtype=torch.long
        )
        ids[:, 0] = first_tokens
        out = F.embedding(ids, embed)
        if self.cfg.input_embedding_scale != 1.0:
            out = out * self.cfg.input_embedding_scale
        return out

    def logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """Drafter logits from final hidden rows through the target's head weight."""
        # A strided (sliced) input sends a bf16 linear down a path ~40x slower on CPU.
        out = F.linear(hidden.contiguous(), lm_head)
        if self.cfg.output_multiplier != 1.0:
            out = out * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        if cap is not None and float(cap) > 0:
            out = torch.tanh(out / float(cap)) * float(cap)
        return out

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """``hidden_norm(fc(features))``: [T, n_layers*hidden] -> [T, hidden]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, features: torch.Tensor) -> ContextKV:
        """Context K/V of every layer for positions ``0..T-1`` (features [T, F]). They depend
        only on the target features and positions, never on a block: compute once per
        sequence, share with every block."""
        ctx = self.context(features)
        cos, sin = self.rotary(torch.arange(ctx.shape[0]), ctx.dtype)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward_block(
        self, features: torch.Tensor, block: torch.Tensor, start: int
    ) -> torch.Tensor:
        """One block, the plain online way: ``features`` [s, F] are the context positions
        ``0..s-1`` (``s = start``), ``block`` [B, hidden] the block's input embeddings.
        Returns the final normed hidden states [B, hidden]."""
        return self.forward_blocks(self.context_kv(features), torch.tensor([start]), block[None])[0]

    def forward_blocks(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        starts: torch.Tensor,
        blocks: torch.Tensor,
    ) -> torch.Tensor:
        """Many blocks at once against shared context K/V (from `context_kv`): ``starts``
        [nb] block start positions, ``blocks`` [nb, B, hidden] input embeddings. Block b
        sees context positions ``< starts[b]`` and its own B rows only, so the result equals
        `forward_block` per block. Returns final hidden [nb, B, hidden]."""
        return Blocks(self, kv, starts, blocks).hidden()

    def blocks(
        self,
        kv: ContextKV | list[ContextKV],
        starts: torch.Tensor,
        first_tokens: torch.Tensor,
        embed: torch.Tensor,
        seq: torch.Tensor | None = None,
    ) -> Blocks:
        """The blocks ``[first_tokens[b], mask, ..., mask]`` at ``starts``, ready for
        `Blocks.hidden` of any rows (their mask rows are projected once in the first layer).
        ``kv``: one sequence's context K/V (from `context_kv`); with ``seq`` (block b's
        sequence, non-decreasing), one context K/V per sequence, indexed by ``seq``."""
        inputs = self.block_inputs(embed, first_tokens)
        return Blocks(self, kv, starts, inputs, shared_tail=True, seq=seq)


def _runs(seq: torch.Tensor) -> tuple[torch.Tensor | None, list[tuple[int, int, int]]]:
    """(the permutation that sorts ``seq``, None when sorted already; its runs of equal
    values in sorted order as ``(value, first, end)``)."""
    order = None
    if len(seq) > 1 and bool((seq[1:] < seq[:-1]).any()):
        order = torch.argsort(seq, stable=True)
        seq = seq[order]
    values, counts = torch.unique_consecutive(seq, return_counts=True)
    runs, at = [], 0
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        runs.append((v, at, at + c))
        at += c
    return order, runs


class Blocks:
    """Drafted blocks against context K/V, the last layer evaluated row by row on demand.

    Every layer but the last runs on all rows: rows of a block attend to each other, so none
    can be skipped there. The last layer's keys and values are computed for every row too,
    but its queries, output projection, MLP and final norm only for the rows `hidden` is
    asked for. Acceptance needs block position ``j`` only where positions ``1..j-1`` were
    right, so an evaluation asks for few rows: about tau per block instead of ``B``.

    ``shared_tail``: rows ``1..B-1`` of every block hold the same (mask) embedding, as
    `DFlashDrafter.block_inputs` builds them; the first layer then normalises and projects
    that row once rather than once per block (RoPE, applied after, still makes them differ).

    ``seq``: the blocks come from several sequences (block b from sequence ``seq[b]``,
    non-decreasing) and ``kv`` holds each one's context K/V. Projections and MLPs run on
    every block at once; attention runs one sequence at a time against that sequence's
    own context, so no block pays for another sequence's context and the result equals
    drafting each sequence's blocks alone.
    """

    def __init__(
        self,
        drafter: DFlashDrafter,
        kv: ContextKV | list[ContextKV],
        starts: torch.Tensor,
        blocks: torch.Tensor,
        shared_tail: bool = False,
        seq: torch.Tensor | None = None,
    ):
        nb, B, H = blocks.shape
        self.drafter, self.starts, self.B = drafter, starts, B
        self.pos = starts[:, None] + torch.arange(B)[None, :]  # [nb, B]
        cos, sin = drafter.rotary(self.pos.reshape(-1), blocks.dtype)
        self.cos, self.sin = cos.view(nb, B, 1, -1), sin.view(nb, B, 1, -1)
        if seq is None:
            kv, seq = [kv], torch.zeros(nb, dtype=torch.long)
        self.seq = seq
        self.runs = _runs(seq)
        runs = self.runs[1]
        # each sequence's context K/V up to the last start any of its blocks has here
        self.kv: dict[int, ContextKV] = {}
        for v, a, b in runs:
            n_ctx = int(starts[a:b].max())
            self.kv[v] = [(k[:, :n_ctx], vv[:, :n_ctx]) for k, vv in kv[v]]
        # The last layer's queries before RoPE, when they come for free (a shared-tail first
        # layer projects every row's anyway); otherwise `hidden` projects the rows it needs.
        self.q_raw: torch.Tensor | None = None
        h = blocks
        last = len(drafter.layers) - 1
        for i, layer in enumerate(drafter.layers):
            attn = layer.self_attn
            if i == 0 and shared_tail:
                # one normalised row per block start, plus the mask row once
                x = layer.input_layernorm(torch.cat((blocks[:, 0], blocks[:1, 1])))
                pick = torch.where(torch.arange(B)[None, :] == 0, torch.arange(nb)[:, None], nb)
                q_raw = attn.queries(x)[pick]
                k_raw, v = (t[pick] for t in attn.raw_keys_values(x))
            else:
                x = layer.input_layernorm(h)
                q_raw = attn.queries(x) if i < last else None
                k_raw, v = attn.raw_keys_values(x)
            k = apply_rope(k_raw, self.cos, self.sin)
            if i == last:
                self.h, self.k, self.v, self.q_raw = h, k, v, q_raw  # the last layer's inputs
                break
            q = apply_rope(q_raw, self.cos, self.sin)
            h = h + self._attend(i, self.runs, q, self.pos, starts, k, v, self.pos)
            h = h + layer.mlp(layer.post_attention_layernorm(h))

    def _attend(self, i, seq_runs, q, q_pos, starts, k, v, k_pos) -> torch.Tensor:
        """Layer ``i``'s attention (`Attention.attend`) of query blocks ``n``, each
        sequence's against its own context (``seq_runs``: `_runs` of the blocks'
        sequences), with one ``o_proj`` for all."""
        attn = self.drafter.layers[i].self_attn
        order, runs = seq_runs
        if len(runs) == 1:
            ck, cv = self.kv[runs[0][0]][i]
            return attn.attend(q, q_pos, starts, ck, cv, k, v, k_pos)
        if order is not None:
            q, q_pos, starts, k, v, k_pos = (t[order] for t in (q, q_pos, starts, k, v, k_pos))
        parts = []
        for s, a, b in runs:
            ck, cv = self.kv[s][i]
            parts.append(
                attn.mix(q[a:b], q_pos[a:b], starts[a:b], ck, cv, k[a:b], v[a:b], k_pos[a:b])
            )
        mixed = torch.cat(parts)
        if order is not None:
            mixed = mixed[torch.argsort(order)]
        return attn.o_proj(mixed)

    def hidden(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final normed hidden states: of every row as [nb, B, hidden] (``rows`` None), or of
        the flat rows ``rows`` (block b, position j = ``b * B + j``) as [len(rows), hidden]."""
        d = self.drafter
        layer = d.layers[-1]
        attn = layer.self_attn
        if rows is None:  # every row: R = B query rows per block
            h, q_raw, cos, sin, q_pos = self.h, self.q_raw, self.cos, self.sin, self.pos
            starts, k, v, k_pos, runs = self.starts, self.k, self.v, self.pos, self.runs
        else:  # one query row per asked row, against its own block's keys
            blk, at = rows // self.B, rows % self.B
            h = self.h[blk, at][:, None]
            q_raw = None if self.q_raw is None else self.q_raw[blk, at][:, None]
            cos, sin = self.cos[blk, at][:, None], self.sin[blk, at][:, None]
            q_pos = self.pos[blk, at][:, None]
            starts, k, v, k_pos = self.starts[blk], self.k[blk], self.v[blk], self.pos[blk]
            runs = _runs(self.seq[blk]) if len(self.kv) > 1 else self.runs
        if q_raw is None:
            q_raw = attn.queries(layer.input_layernorm(h))
        q = apply_rope(q_raw, cos, sin)
        h = h + self._attend(len(d.layers) - 1, runs, q, q_pos, starts, k, v, k_pos)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        out = d.norm(h)
        return out if rows is None else out[:, 0]


# ---------------------------------------------------------------------------------------------
# Checkpoint loading
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadReport:
    files: list[str]
    source_dtypes: list[str]
    ignored_keys: list[str]
    parameters: int


def load_drafter(
    path: str,
    dtype: torch.dtype = torch.bfloat16,
    num_target_layers: int | None = None,
) -> tuple[DFlashDrafter, LoadReport]:
    """Load a drafter from a z-lab folder or training-format weights, cast to ``dtype``.

    Accepts z-lab checkpoints, sharded safetensors with an index, ``.pt``/``.bin`` state dicts
    (``torch.load(weights_only=True)``), wrapper prefixes (``model.``, ``module.``,
    ``_orig_mod.``, ``draft_model.``) and fp32 masters. Raises `UserError` naming any key that
    does not map, any missing key, and an ``fc`` width that disagrees with the layer ids.
    """
    cfg = read_config(path, num_target_layers)
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    expected = {k: v for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    ignored, unknown, dtypes = [], [], set()
    files = _weight_files(path)
    for f in files:
        for raw_key, t in _read_state(f).items():
            key = normalise_key(raw_key)
            if key in expected:
                state[key] = t
                dtypes.add(str(t.dtype).replace("torch.", ""))
            elif key in IGNORABLE_KEYS or key.endswith("rotary_emb.inv_freq"):
                ignored.append(raw_key)
            else:
                unknown.append(raw_key)
    if unknown:
        raise UserError(
            "drafter weights have keys that do not map to a "
            f"DFlash drafter: {', '.join(sorted(unknown)[:8])}"
        )
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UserError(
            f"drafter weights lack {', '.join(missing[:8])}; "
            f"is {path} a complete DFlash checkpoint?"
        )
    fc_in = state["fc.weight"].shape[1]
    want = len(cfg.target_layer_ids) * cfg.hidden_size
    if fc_in != want:
        raise UserError(
            f"drafter fc takes {fc_in} features but {len(cfg.target_layer_ids)} "
            f"target layers x hidden {cfg.hidden_size} = {want}; "
            "fix target_layer_ids in the drafter config"
        )
    for key, t in state.items():
        if tuple(t.shape) != tuple(expected[key].shape):
            raise UserError(
                f"drafter weight {key} has shape {tuple(t.shape)}, "
                f"config implies {tuple(expected[key].shape)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True, strict=False)
    model.rotary = Rotary(cfg)  # rebuilt off meta
    model.eval().requires_grad_(False)
    report = LoadReport(
        files=files,
        source_dtypes=sorted(dtypes),
        ignored_keys=ignored,
        parameters=sum(t.numel() for t in state.values()),
    )
    return model, report


def save_zlab(model: DFlashDrafter, folder: str) -> None:
    """Write ``model`` as a z-lab checkpoint: ``config.json`` + ``model.safetensors``."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if "rotary" not in k}
    save_file(state, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(model.cfg.raw, fh, indent=2)
