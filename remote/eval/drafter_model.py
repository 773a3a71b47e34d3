"""The DFlash drafter's forward in plain PyTorch (docs/dflash-eval.md); lazy import (torch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from remote.eval.drafter_config import DrafterConfig
from remote.eval.drafter_layers import Layer, RMSNorm, Rotary, apply_rope

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]


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
        """Block inputs [nb, B, hidden]: ``[token, mask, ...]`` in the target's ``embed``."""
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
        # A strided (sliced) input sends a bf16 linear down a far slower CPU path.
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
        """Context K/V of every layer for positions ``0..T-1``: once per sequence, any block."""
        ctx = self.context(features)
        cos, sin = self.rotary(torch.arange(ctx.shape[0]), ctx.dtype)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward_block(
        self, features: torch.Tensor, block: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Final hidden [B, hidden] of one block at ``start``, context ``features`` [start, F]."""
        return self.forward_blocks(self.context_kv(features), torch.tensor([start]), block[None])[0]

    def forward_blocks(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        starts: torch.Tensor,
        blocks: torch.Tensor,
    ) -> torch.Tensor:
        """Final hidden of blocks on shared context K/V (= `forward_block`)."""
        return Blocks(self, kv, starts, blocks).hidden()

    def blocks(
        self,
        kv: ContextKV | list[ContextKV],
        starts: torch.Tensor,
        first_tokens: torch.Tensor,
        embed: torch.Tensor,
        seq: torch.Tensor | None = None,
    ) -> Blocks:
        """The blocks at ``starts`` ready for `Blocks.hidden`, per sequence."""
        inputs = self.block_inputs(embed, first_tokens)
        return Blocks(self, kv, starts, inputs, shared_tail=True, seq=seq)


def _runs(seq: torch.Tensor) -> tuple[torch.Tensor | None, list[tuple[int, int, int]]]:
    """(sorting permutation of ``seq`` or None, its runs ``(value, first, end)`` once sorted)."""
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
    """Drafted blocks; the last layer runs only for rows asked for (about tau per block)."""

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
        self.pos = starts[:, None] + torch.arange(B)[None, :]
        cos, sin = drafter.rotary(self.pos.reshape(-1), blocks.dtype)
        self.cos, self.sin = cos.view(nb, B, 1, -1), sin.view(nb, B, 1, -1)
        if seq is None:
            kv, seq = [kv], torch.zeros(nb, dtype=torch.long)
        self.seq = seq
        self.runs = _runs(seq)
        runs = self.runs[1]
        self.kv: dict[int, ContextKV] = {}
        for v, a, b in runs:
            n_ctx = int(starts[a:b].max())
            self.kv[v] = [(k[:, :n_ctx], vv[:, :n_ctx]) for k, vv in kv[v]]
        # last layer's queries before RoPE when a shared-tail first layer projects them anyway
        self.q_raw: torch.Tensor | None = None
        h = blocks
        last = len(drafter.layers) - 1
        for i, layer in enumerate(drafter.layers):
            attn = layer.self_attn
            if i == 0 and shared_tail:
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
                self.h, self.k, self.v, self.q_raw = h, k, v, q_raw
                break
            q = apply_rope(q_raw, self.cos, self.sin)
            h = h + self._attend(i, self.runs, q, self.pos, starts, k, v, self.pos)
            h = h + layer.mlp(layer.post_attention_layernorm(h))

    def _attend(self, i, seq_runs, q, q_pos, starts, k, v, k_pos) -> torch.Tensor:
        """Layer ``i``'s attention, each sequence's blocks against its own context."""
        attn = self.drafter.layers[i].self_attn
        order, runs = seq_runs
        if order is not None:
            q, q_pos, starts, k, v, k_pos = (t[order] for t in (q, q_pos, starts, k, v, k_pos))
        contexts = [self.kv[s][i] for s, _a, _b in runs]
        mixed = attn.mix(q, q_pos, starts, contexts, [(a, b) for _s, a, b in runs], k, v, k_pos)
        if order is not None:
            mixed = mixed[torch.argsort(order)]
        return attn.o_proj(mixed)

    @classmethod
    def joined(cls, parts: list[tuple[Blocks, list[int]]]) -> Blocks:
        """Several ``(blocks, i)`` as one `Blocks`, for one `hidden` call."""
        if len(parts) == 1 and parts[0][1] == list(range(len(parts[0][0].starts))):
            return parts[0][0]
        out = cls.__new__(cls)
        out.drafter, out.B = parts[0][0].drafter, parts[0][0].B
        picks = [(b, torch.tensor(i, dtype=torch.long)) for b, i in parts]
        for name in ("starts", "pos", "cos", "sin", "seq", "h", "k", "v"):
            setattr(out, name, torch.cat([getattr(b, name)[i] for b, i in picks]))
        raw = [b.q_raw for b, _i in picks]
        out.q_raw = (
            None
            if any(q is None for q in raw)
            else torch.cat([q[i] for q, (_b, i) in zip(raw, picks, strict=True)])
        )
        out.kv = {}
        for b, _i in picks:
            for s, layers in b.kv.items():
                if s not in out.kv or layers[0][0].shape[1] > out.kv[s][0][0].shape[1]:
                    out.kv[s] = layers
        out.runs = _runs(out.seq)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of what these blocks hold for `hidden` (the context K/V are views)."""
        held = (self.h, self.k, self.v, self.q_raw, self.cos, self.sin, self.pos)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def hidden(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final normed hidden [nb, B, hidden], or of flat ``rows`` (``b * B + j``) only."""
        if rows is None:
            every = (self.h, self.q_raw, self.cos, self.sin, self.pos)
            return self._last_layer(*every, self.starts, self.k, self.v, self.pos, self.runs)
        blk, at = rows // self.B, rows % self.B
        q_raw = None if self.q_raw is None else self.q_raw[blk, at][:, None]
        asked = (self.h[blk, at][:, None], q_raw, self.cos[blk, at][:, None])
        asked += (self.sin[blk, at][:, None], self.pos[blk, at][:, None])
        own = (self.starts[blk], self.k[blk], self.v[blk], self.pos[blk])
        return self._last_layer(*asked, *own, self._runs_of(blk))[:, 0]

    def depths(self, blocks: torch.Tensor, first: int, width: int) -> torch.Tensor:
        """`hidden` of depths ``first .. first+width-1`` of ``blocks``, keys gathered once."""
        at = slice(first, first + width)
        q_raw = None if self.q_raw is None else self.q_raw[blocks, at]
        asked = (self.h[blocks, at], q_raw, self.cos[blocks, at], self.sin[blocks, at])
        own = (self.starts[blocks], self.k[blocks], self.v[blocks], self.pos[blocks])
        return self._last_layer(*asked, self.pos[blocks, at], *own, self._runs_of(blocks))

    def _runs_of(self, blocks: torch.Tensor) -> tuple[torch.Tensor | None, list]:
        """`_runs` of ``blocks``; without sorting for one sequence."""
        if len(self.kv) > 1:
            return _runs(self.seq[blocks])
        return None, [(self.runs[1][0][0], 0, len(blocks))]

    def _last_layer(self, h, q_raw, cos, sin, q_pos, starts, k, v, k_pos, runs) -> torch.Tensor:
        """The last layer and final norm of query rows ``h`` [n, R, hidden] of their blocks."""
        d = self.drafter
        layer = d.layers[-1]
        if q_raw is None:
            q_raw = layer.self_attn.queries(layer.input_layernorm(h))
        q = apply_rope(q_raw, cos, sin)
        h = h + self._attend(len(d.layers) - 1, runs, q, q_pos, starts, k, v, k_pos)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return d.norm(h)
