"""The linear layers' matrix product: the library's `F.linear`, or a batch-invariant one.

BLAS and cuBLAS pick their kernel, blocking and reduction split by the number of
rows M, so one row's `x @ W^T` changes in its last bits with the batch around it
(measured on the CPU, torch float32: a row alone differs from the same row among
7 or 64 others by up to 3e-6). Enough to flip a greedy token after a few dozen
steps. `TiledMatmul` (CPU) runs every row through a product of one shape: rows go
in tiles of `TILE_ROWS`, the last one padded, as one `bmm` over the tiles, and
within a fixed shape a row's result depends on nothing but the row (measured:
any position in the tile, any other rows, any tile count). On CUDA the
deterministic mode uses `TritonMatmul` (triton_matmul.py's kernel): one tile config, no split-K.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows per product in the tiled path. Smaller tiles waste less on padded decode rows,
# larger ones run prefill chunks faster (benchmarks/bench_deterministic.py).
TILE_ROWS = 16


class Matmul:
    """`y = x W^T + b` by the library: fastest, row results depend on the batch."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, weight, bias)


class TiledMatmul(Matmul):
    """Batch-invariant on the CPU: fixed-size row tiles, one product shape for every row."""

    def __init__(self, tile_rows: int = TILE_ROWS) -> None:
        self.tile_rows = tile_rows

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        rows = x.reshape(-1, k)
        m, t = rows.shape[0], self.tile_rows
        if m == 0:
            return F.linear(x, weight, bias)
        tiles = -(-m // t)
        padded = rows.new_zeros(tiles * t, k)
        padded[:m] = rows
        # The weight is shared by every tile through a stride-0 batch dim: no copy.
        w = weight.t().unsqueeze(0).expand(tiles, k, weight.shape[0])
        y = torch.bmm(padded.view(tiles, t, k), w).view(tiles * t, -1)[:m]
        if bias is not None:
            y = y + bias
        return y.view(*lead, weight.shape[0])


class TritonMatmul(Matmul):
    """Batch-invariant on CUDA: every `linear` is one fixed-config Triton kernel."""

    def __init__(self) -> None:
        from radixserve.runtime.triton_matmul import triton_linear  # imports triton: CUDA only

        self._linear = triton_linear

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._linear(x, weight, bias)


DEFAULT_MATMUL = Matmul()


def make_matmul(deterministic: bool, device: torch.device) -> Matmul:
    """The library's product, or the batch-invariant one of `device` (Triton on CUDA)."""
    if not deterministic:
        return DEFAULT_MATMUL
    if device.type == "cuda":
        return TritonMatmul()
    return TiledMatmul()
