"""The layers of a DFlash drafter in plain PyTorch, weight names as z-lab's; lazy import (torch)."""

from __future__ import annotations

import torch
from torch import nn

from remote.errors import UserError
from remote.eval.drafter_config import DrafterConfig

# past this many context positions the scores go a chunk at a time
CONTEXT_CHUNK = 2048


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
    """cos/sin for absolute positions from transformers' RoPE helpers."""

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
        except Exception as exc:
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
        """k-normed keys and values of rows ``x`` -> [..., kv_heads, head_dim], before RoPE."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)))
        return k, self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of context rows ``x`` [n, hidden] -> [kv_heads, n, head_dim]."""
        k, v = self.raw_keys_values(x)
        return apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Visibility by position [..., q, k] (causal, sliding: z-lab's rule); None: all."""
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

    def mix(
        self,
        q: torch.Tensor,
        q_pos: torch.Tensor,
        starts: torch.Tensor,
        contexts: list[tuple[torch.Tensor, torch.Tensor]],
        bounds: list[tuple[int, int]],
        blk_k: torch.Tensor,
        blk_v: torch.Tensor,
        blk_pos: torch.Tensor,
    ) -> torch.Tensor:
        """``R`` rows per block against its sequence's context (docs/dflash-eval.md)."""
        nb, R, H, d = q.shape
        kvh = self.num_kv_heads
        g, B = H // kvh, blk_k.shape[1]
        longest = max(ck.shape[1] for ck, _cv in contexts)
        M, C = R * g, min(longest, CONTEXT_CHUNK)
        first = [(ck[:, :C], cv[:, :C]) for ck, cv in contexts]
        qt = (q.float() * d**-0.5).view(nb, R, kvh, g, d).permute(2, 0, 1, 3, 4)
        qt = qt.reshape(kvh, nb, M, d)
        scores = qt.new_empty(kvh, nb, M, C + B)
        for (ck, _cv), (a, b) in zip(first, bounds, strict=True):
            c, rows = ck.shape[1], (b - a) * M
            part = torch.matmul(qt[:, a:b].reshape(kvh, rows, d), ck.float().transpose(1, 2))
            scores[:, a:b, :, :c] = part.view(kvh, b - a, M, c)
        scores[..., C:] = torch.matmul(qt, blk_k.float().permute(2, 0, 3, 1))
        # unwritten columns past a shorter context are hidden too
        ctx_ok = torch.arange(C)[None, None, :] < starts[:, None, None]
        vis = self.visible(q_pos, torch.arange(C))
        ctx_ok = ctx_ok if vis is None else ctx_ok & vis
        by_row = scores.view(kvh, nb, R, g, C + B)
        by_row[..., :C].masked_fill_(~ctx_ok[None, :, :, None, :], float("-inf"))
        blk_ok = self.visible(q_pos, blk_pos)
        if blk_ok is not None:
            by_row[..., C:].masked_fill_(~blk_ok[None, :, :, None, :], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        out = torch.matmul(p[..., C:], blk_v.float().permute(2, 0, 1, 3))
        for (ck, cv), (a, b) in zip(first, bounds, strict=True):
            c, rows = ck.shape[1], (b - a) * M
            part = torch.matmul(p[:, a:b, :, :c].reshape(kvh, rows, c), cv.float())
            out[:, a:b] += part.view(kvh, b - a, M, d)
        del p
        if longest > C:
            out = self._rest(qt, out, scores, contexts, bounds, starts, q_pos, R)
        out = out.view(kvh, nb, R, g, d).permute(1, 2, 0, 3, 4)
        return out.reshape(nb, R, H * d).to(q.dtype)

    def _rest(self, qt, out, scores, contexts, bounds, starts, q_pos, R: int) -> torch.Tensor:
        """`mix` with the context past `CONTEXT_CHUNK` folded in; not in place."""
        kvh, nb, M, d = out.shape
        g = M // R
        m_all = scores.amax(-1, keepdim=True)
        l_all = torch.exp(scores - m_all).sum(-1, keepdim=True)
        parts, seen = [], []
        for (ck, cv), (a, b) in zip(contexts, bounds, strict=True):
            m, l, acc = m_all[:, a:b], l_all[:, a:b], out[:, a:b] * l_all[:, a:b]  # noqa: E741
            touched = torch.zeros(b - a, R, 1, dtype=torch.bool)
            low = 0 if self.sliding_window is None else int(starts[a:b].min()) - self.sliding_window
            for c0 in range(
                max(CONTEXT_CHUNK, low - low % CONTEXT_CHUNK), ck.shape[1], CONTEXT_CHUNK
            ):
                cols = torch.arange(c0, min(c0 + CONTEXT_CHUNK, ck.shape[1]))
                ok = cols[None, None, :] < starts[a:b, None, None]
                vis = self.visible(q_pos[a:b], cols)
                ok = ok if vis is None else ok & vis
                if not bool(ok.any()):
                    continue
                rows, w = (b - a) * M, len(cols)
                kc = ck[:, c0 : c0 + w].float().transpose(1, 2)
                s = torch.matmul(qt[:, a:b].reshape(kvh, rows, d), kc).view(kvh, b - a, M, w)
                s.view(kvh, b - a, R, g, w).masked_fill_(~ok[None, :, :, None, :], float("-inf"))
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                scale, pc = torch.exp(m - m_new), torch.exp(s - m_new)
                l = l * scale + pc.sum(-1, keepdim=True)  # noqa: E741 (flash attention's l)
                vc = cv[:, c0 : c0 + w].float()
                got = torch.matmul(pc.reshape(kvh, rows, w), vc).view(kvh, b - a, M, d)
                acc, m = acc * scale + got, m_new
                touched = touched | ok.any(-1, keepdim=True)
            parts.append(acc / l)
            seen.append(touched)
        rows = torch.cat(seen).expand(nb, R, g).reshape(1, nb, M, 1)
        return torch.where(rows, torch.cat(parts, dim=1), out)


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
