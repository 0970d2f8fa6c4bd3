"""Batch-invariant attention in plain PyTorch (`EngineConfig(deterministic=True)` on the CPU).

Each new token attends on its own to keys 0..its position, in key tiles of
`KV_TILE` aligned to position 0, so its sums never depend on the batch, on the
padding of other rows, nor on how its prompt was cut into chunks or a cached
prefix. Every reduction has a fixed length and order:

- logits: `(q * k).sum(-1)` over the head dim. Not a matmul: BLAS reduces a
  row differently by the number of rows (measured, see runtime/matmul.py),
  while an elementwise product and a last-dim sum treat each row alike whatever
  the leading size (measured too).
- softmax: the max over every visible key (exact in any order), then per tile
  the sum of `exp(s - max)` over `KV_TILE` entries and the weighted values over
  the same tile, added to the running totals tile after tile. Tiles past a
  token's position would add exact zeros, so each tile runs only for the tokens
  that reach it.

Costs far more than SDPA (products are materialised per tile, in chunks of tokens
that stay in cache; every token gathers its own keys); it exists to make the CPU's
results reproducible, not fast.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from radixserve.runtime.attention.base import AttentionBackend, KernelBuild, LayerOptions
from radixserve.runtime.attention.invariant_rows import token_positions
from radixserve.runtime.forward_batch import ForwardBatch

KV_TILE = 32
# Elements of the per-key products one step of a tile materialises (1 MiB of float32). A whole
# tile at once held [Tt, Hq, KV_TILE, D] floats: 38 MB for a 512-token chunk of SmolLM2-135M,
# 268 MB with 32 heads of 128. In chunks, a 1,024-token prefill layer of SmolLM2's heads took
# 30-43 ms against 120-160 on the main thread (2 cores); inside the engine's worker thread
# this machine showed no gain (other per-op costs dominate there).
PRODUCT_ELEMENTS = 1 << 18

_Tile = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # rows [Tt], slots [Tt, KV_TILE], key positions
VisibleFn = Callable[[int, int | None], torch.Tensor]  # (tile, window) -> [Tt, KV_TILE] bool


class InvariantTorchAttention(AttentionBackend):
    name = "torch-invariant"

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        return []  # plain PyTorch ops: nothing compiles

    @property
    def supports_windows(self) -> bool:
        return True

    @property
    def supports_logit_softcap(self) -> bool:
        return True

    def plan(self, batch: ForwardBatch) -> None:
        # The tiles are the same for every layer: built once per step from host lengths.
        pos, start = token_positions(batch)
        device = batch.kv_indices.device
        self._pos = torch.from_numpy(pos).to(device)
        self._tiles: list[_Tile] = []
        self._masks: dict[tuple[int, int | None], torch.Tensor] = {}
        offs = np.arange(KV_TILE, dtype=np.int64)
        for t0 in range(0, int(pos.max()) + 1 if len(pos) else 0, KV_TILE):
            rows = np.flatnonzero(pos >= t0)  # the tokens whose context reaches this tile
            keys = t0 + offs
            idx = np.where(keys[None, :] <= pos[rows, None], start[rows, None] + keys[None, :], 0)
            slots = batch.kv_indices[torch.from_numpy(idx).to(device)].long()
            self._tiles.append((torch.from_numpy(rows).to(device), slots, torch.from_numpy(keys).to(device)))

    def _visible(self, i: int, window: int | None) -> torch.Tensor:
        """`[Tt, KV_TILE]`: which keys of tile i each of its tokens sees."""
        if (i, window) not in self._masks:
            rows, _, keys = self._tiles[i]
            p = self._pos[rows][:, None]
            mask = keys[None, :] <= p
            if window is not None:
                mask &= keys[None, :] > p - window
            self._masks[i, window] = mask
        return self._masks[i, window]

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        t, hq, d = q.shape
        hk = self.num_kv_heads
        qg = q.float().view(t, hk, hq // hk, d).contiguous()
        return (
            invariant_attention(
                qg, (k_buf, v_buf), self._tiles, self._visible, self.scale, self.layer_options[layer]
            )
            .view(t, hq, d)
            .to(q.dtype)
        )


def invariant_attention(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    tiles: list[_Tile],
    visible: VisibleFn,
    scale: float,
    opts: LayerOptions,
) -> torch.Tensor:
    """q `[T, Hkv, G, D]` float32 over the pool buffers `kv` (`[S, Hkv, D]`) -> `[T, Hkv, G, D]`."""
    k_buf, v_buf = kv
    neg_inf = float("-inf")
    row_max = q.new_full(q.shape[:-1], neg_inf)
    # Tokens per product: each tile's per-key products ([c, Hkv, G, KV_TILE, D]) stay near
    # PRODUCT_ELEMENTS, in cache; a row's sums are the same in a chunk of any size.
    c = max(1, PRODUCT_ELEMENTS // (q.shape[1] * q.shape[2] * KV_TILE * q.shape[3]))
    logits: list[torch.Tensor] = []
    for i, (rows, slots, _) in enumerate(tiles):
        s = q.new_empty(len(rows), *q.shape[1:3], KV_TILE)  # [Tt, Hkv, G, KV_TILE]
        for a in range(0, len(rows), c):
            keys = k_buf[slots[a : a + c]].float().transpose(1, 2)  # [c, Hkv, KV_TILE, D]
            s[a : a + c] = (q[rows[a : a + c]][:, :, :, None, :] * keys[:, :, None, :, :]).sum(-1)
        s *= scale
        if opts.softcap is not None:
            s = torch.tanh(s / opts.softcap) * opts.softcap
        s = s.masked_fill(~visible(i, opts.window)[:, None, None, :], neg_inf)
        row_max[rows] = torch.maximum(row_max[rows], s.amax(-1))
        logits.append(s)
    total = torch.zeros_like(row_max)
    acc = torch.zeros_like(q)
    for i, ((rows, slots, _), s) in enumerate(zip(tiles, logits)):
        e = torch.exp(s - row_max[rows][..., None])  # exactly 0 where masked
        unseen = ~visible(i, opts.window)[:, :, None, None]
        total[rows] = total[rows] + e.sum(-1)
        weighted = torch.empty_like(q[rows])  # [Tt, Hkv, G, D]
        for a in range(0, len(rows), c):
            # Unseen slots may hold anything (padding reads slot 0): zero them, so 0 * value is 0.
            vals = v_buf[slots[a : a + c]].float().masked_fill(unseen[a : a + c], 0.0).transpose(1, 2)
            weighted[a : a + c] = (e[a : a + c, ..., None] * vals[:, :, None, :, :]).sum(-2)
        acc[rows] = acc[rows] + weighted
    return acc / total[..., None]
