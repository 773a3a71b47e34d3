"""Gated DeltaNet's delta rule and convolution at CPU matrix speed (docs/eval.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last axis (flash-linear-attention's, the reference's)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def unit_lower_inverse(low: torch.Tensor) -> torch.Tensor:
    """``(I + low)^-1`` of strictly lower triangular ``low`` by batched products."""
    c = low.shape[-1]
    if c <= 16:
        m = -low
        x = m + torch.eye(c, dtype=low.dtype, device=low.device)
        power = 1
        while 2 * power < c:
            m = m @ m
            x = x + x @ m
            power *= 2
        return x
    h = c // 2
    top, bottom = low[..., :h, :h], low[..., h:, h:]
    if c == 2 * h:
        top, bottom = unit_lower_inverse(torch.stack((top, bottom))).unbind(0)
    else:
        top, bottom = unit_lower_inverse(top), unit_lower_inverse(bottom)
    out = torch.zeros_like(low)
    out[..., :h, :h] = top
    out[..., h:, h:] = bottom
    out[..., h:, :h] = -(bottom @ (low[..., h:, :h] @ top))
    return out


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **_kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' ``torch_chunk_gated_delta_rule``, chunk by chunk at matrix speed."""
    out_dtype = query.dtype
    b, t, hk, dk = key.shape
    hv, dv = value.shape[-2:]
    r, c = hv // hk, chunk_size
    n = -(-t // c)
    pad = n * c - t

    def heads(x: torch.Tensor) -> torch.Tensor:
        # one copy: to float32, heads first
        x = x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        return F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad)) if pad else x

    q, k = heads(query), heads(key)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * dk**-0.5
    q, k = q.reshape(b, hk, 1, n, c, dk), k.reshape(b, hk, 1, n, c, dk)
    bt = heads(beta).reshape(b, hk, r, n, c, 1)
    cum = heads(g).reshape(b, hk, r, n, c).cumsum(-1)

    # decay[i, j] = exp(cum_i - cum_j) for j <= i within a chunk, 0 above
    later = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill_(later, float("-inf")).exp_()
    kt = k.transpose(-1, -2)
    intra = (q @ kt) * decay
    # (I + strictly lower part of beta_i k_i.k_j decay_ij)^-1, the chunk's WY transform
    wy = unit_lower_inverse(((k @ kt) * decay).mul_(bt).tril_(-1))
    gain = cum.exp()[..., None]
    u = wy @ (heads(value).reshape(b, hk, r, n, c, dv) * bt)
    # per chunk: decayed keys (WY-mixed) and queries read the state, keys write it
    rk = (wy @ (k * (bt * gain))).reshape(-1, n, c, dk)
    rq = (q * gain).reshape(-1, n, c, dk)
    writes = (k * (cum[..., -1:, None] - cum[..., None]).exp()).transpose(-1, -2)
    writes = writes.reshape(-1, n, dk, c)
    intra, u = intra.reshape(-1, n, c, c), u.reshape(-1, n, c, dv)
    fade = cum[..., -1].exp().reshape(-1, n, 1, 1)

    state = None if initial_state is None else initial_state.float().reshape(-1, dk, dv)
    out = torch.empty(b * hv, n, c, dv, dtype=torch.float32, device=q.device)
    for i in range(n):
        if state is None:
            fresh = u[:, i]
            torch.bmm(intra[:, i], fresh, out=out[:, i])
            state = writes[:, i] @ fresh
            continue
        fresh = torch.baddbmm(u[:, i], rk[:, i], state, alpha=-1)
        out[:, i] = torch.baddbmm(rq[:, i] @ state, intra[:, i], fresh)
        state = torch.baddbmm(state * fade[:, i], writes[:, i], fresh)
    out = out.reshape(b, hv, n * c, dv).transpose(1, 2)  # [b, n * c, hv, dv]
    final = None
    if output_final_state:
        final = torch.zeros(b, hv, dk, dv) if state is None else state.reshape(b, hv, dk, dv)
    return out[:, :t].to(out_dtype, memory_format=torch.contiguous_format), final


def causal_conv1d_fn(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **_kwargs,
) -> torch.Tensor:
    """transformers' ``causal_conv1d_fn`` on the time-major view, no transposed copy."""
    from transformers.activations import ACT2FN

    t, width = hidden_states.shape[-1], weight.shape[-1]
    x = hidden_states.to(weight.dtype).unsqueeze(2)
    out = F.conv2d(x, weight[:, None, None, :], bias, padding=(0, width - 1), groups=x.shape[1])
    out = out[..., :t].squeeze(2)
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)
