"""The KV pool: per-layer K and V tensors indexed by slot.

One slot holds the K and V of one token in every layer. Slot ids come from
the `SlotAllocator`; the pool itself only stores and never decides who owns
what. The buffers are `[num_slots, num_kv_heads, head_dim]` per layer, which
FlashInfer reads as a paged cache with page size 1 (`view(-1, 1, H, D)`).

On the CPU the buffers are left uninitialised: zeroing a default pool (up to
1 GiB) would cost seconds at start, while untouched pages of a fresh
allocation cost nothing until a slot is written. The torch backend reads only
written slots (new tokens are written before attention; padded decode rows
point at a written slot), so no garbage, NaN included, reaches a softmax. GPU
buffers stay zeroed (cheap there): CUDA-graph padding and the other backends
may read slots nothing wrote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixserve.cache.kv_quant import FP8_KV_DTYPE, quantize


@dataclass(frozen=True)
class KVPoolConfig:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32  # what the buffers hold
    device: str = "cpu"
    # An FP8 pool only: the dtype attention computes in (the model's), and per-layer K and V
    # scales (empty: 1.0 for every layer).
    compute_dtype: torch.dtype | None = None
    k_scales: tuple[float, ...] = ()
    v_scales: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.fp8 and (self.compute_dtype is None or self.compute_dtype == FP8_KV_DTYPE):
            raise ValueError(f"an FP8 KV pool needs a compute_dtype to read into, got {self.compute_dtype}")
        for name in ("k_scales", "v_scales"):
            scales = getattr(self, name)
            if scales and (not self.fp8 or len(scales) != self.num_layers):
                raise ValueError(
                    f"KVPoolConfig.{name}: {len(scales)} scales for an "
                    f"{'FP8' if self.fp8 else 'unquantized'} pool of {self.num_layers} layers"
                )
            if not all(math.isfinite(s) and s > 0 for s in scales):
                raise ValueError(f"KVPoolConfig.{name}={scales!r}: scales must be finite and > 0")

    @property
    def fp8(self) -> bool:
        return self.dtype == FP8_KV_DTYPE

    @property
    def attn_dtype(self) -> torch.dtype:
        """The dtype attention reads the pool in: the model's for an FP8 pool, else the pool's."""
        return self.compute_dtype if self.fp8 and self.compute_dtype is not None else self.dtype

    def k_scale(self, layer: int) -> float:
        return self.k_scales[layer] if self.k_scales else 1.0

    def v_scale(self, layer: int) -> float:
        return self.v_scales[layer] if self.v_scales else 1.0

    @property
    def bytes_per_slot(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


class KVPool:
    def __init__(self, config: KVPoolConfig, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"KV pool needs at least one slot, got num_slots={num_slots}")
        self.config = config
        self.num_slots = num_slots
        shape = (num_slots, config.num_kv_heads, config.head_dim)
        new = torch.empty if torch.device(config.device).type == "cpu" else torch.zeros
        self.k = [new(shape, dtype=config.dtype, device=config.device) for _ in range(config.num_layers)]
        self.v = [new(shape, dtype=config.dtype, device=config.device) for _ in range(config.num_layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of new tokens (`[T, H, D]`) at `slots` (`[T]`)."""
        c = self.config
        if c.fp8:
            self.k[layer][slots] = quantize(k, c.k_scale(layer))
            self.v[layer][slots] = quantize(v, c.v_scale(layer))
            return
        self.k[layer][slots] = k.to(c.dtype)
        self.v[layer][slots] = v.to(c.dtype)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.config.bytes_per_slot
