"""Sliding-window masks and soft-capped attention for the torch reference backend.

A window is a mask over positions, never a different KV layout: the pool keeps
one slot per token of the whole context, so a cached prefix serves windowed
and full layers alike and the radix cache needs to know nothing of windows.
Soft-capping (`cap * tanh(s / cap)` of the scaled logits, before the mask) has
no SDPA form, so those layers run the matmuls themselves, in the order
transformers' eager attention uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(prefix: int, extend: int, window: int | None, device: torch.device) -> torch.Tensor:
    """`[extend, prefix + extend]` bool: new token i (position prefix + i) sees key j."""
    q_pos = torch.arange(prefix, prefix + extend, device=device)[:, None]
    kv_pos = torch.arange(prefix + extend, device=device)[None, :]
    mask = kv_pos <= q_pos
    if window is not None:
        mask &= kv_pos > q_pos - window
    return mask


def window_valid(valid: torch.Tensor, lens: torch.Tensor, window: int) -> torch.Tensor:
    """Padded one-token rows (`valid` `[R, L]`, row r's query at position lens[r] - 1):
    also drop the keys older than the window."""
    cols = torch.arange(valid.shape[-1], device=valid.device)[None, :]
    return valid & (cols >= lens[:, None] - window)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    gqa: bool,
) -> torch.Tensor:
    """q `[..., Hq, n, D]`, k/v `[..., Hkv, L, D]`, mask broadcastable to `[..., Hq, n, L]`."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    group = q.shape[-3] // k.shape[-3]
    if group > 1:
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)
