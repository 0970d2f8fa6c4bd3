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

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVPoolConfig:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

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
        self.k[layer][slots] = k.to(self.config.dtype)
        self.v[layer][slots] = v.to(self.config.dtype)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.config.bytes_per_slot
