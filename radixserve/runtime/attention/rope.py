"""A layer's rotary embedding as the attention backend takes it (kv_store_select.py says why the
backend, not the model, applies it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# (positions [T], q [T, Hq, D], k [T, Hkv, D], cos, sin) -> (q, k) rotated (in place or anew).
RopeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


@dataclass(frozen=True, eq=False)
class Rope:
    """A layer's rotary embedding: float32 `[max_positions, R / 2]` cos and sin tables over
    each head's leading R dims ("rotate half" layout; the other dims pass through), and the
    model's op computing it, for writers that do not fuse it."""

    cos: torch.Tensor
    sin: torch.Tensor
    apply: RopeFn
