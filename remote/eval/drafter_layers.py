"""The layers a DFlash drafter is built of, in plain PyTorch: Qwen3's RMSNorm and RoPE, the
drafter's attention (block queries against context and block keys, one sequence's context
at a time: `Attention.attend`), its MLP and decoder layer. Weight names match z-lab's.

torch and transformers are imported at module import: import this module lazily.
"""

from __future__ import annotations

import torch
from torch import nn

from remote.errors import UserError
from remote.eval.drafter_config import DrafterConfig


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
