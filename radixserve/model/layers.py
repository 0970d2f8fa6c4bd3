"""Building blocks of the Llama family: norm, rotary embedding, linear layers, activation.

Parameters are created with `torch.empty` in the given dtype on the current
default device (the loader builds under `with torch.device(...)`), so a model
is never initialised twice: the loader fills the weights from a checkpoint or
with dummy values. Parameters never require grad: this is an inference engine.

The elementwise ops (norm, rotary, activation) come from the module's
`kernels` (runtime/kernels.py): the reference follows transformers' Llama
code operation for operation (same casts, same order) so float32 results
agree to rounding; on a GPU `use_kernels` swaps in FlashInfer's fused ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.model.config import RopeConfig
from radixserve.runtime.kernels import TORCH_KERNELS, TorchKernels


def _param(*shape: int, dtype: torch.dtype, fill: float | None = None) -> nn.Parameter:
    data = torch.empty(*shape, dtype=dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
    return nn.Parameter(data, requires_grad=False)


class RMSNorm(nn.Module):
    kernels: TorchKernels = TORCH_KERNELS

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(dim, dtype=dtype, fill=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x); the fused kernel reuses both buffers."""
        return self.kernels.add_rms_norm(x, residual, self.weight, self.eps)


class Linear(nn.Module):
    """`y = x W^T + b`. The unit tensor parallelism will shard: a column-parallel
    linear keeps a slice of the output features, a row-parallel one a slice of
    the input features and all-reduces."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = _param(out_features, in_features, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class FusedLinear(Linear):
    """Projections of the same input stacked along the output dim (q/k/v, gate/up):
    one matmul instead of several. Each part keeps its name so the loader can
    copy the checkpoint's separate tensors into their rows."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool, dtype: torch.dtype) -> None:
        super().__init__(in_features, sum(parts.values()), bias, dtype)
        self.part_sizes = dict(parts)
        self._offsets: dict[str, int] = {}
        offset = 0
        for name, size in parts.items():
            self._offsets[name] = offset
            offset += size

    def part_rows(self, part: str) -> slice:
        """Rows of the weight (and entries of the bias) that hold `part`."""
        start = self._offsets[part]
        return slice(start, start + self.part_sizes[part])

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(list(self.part_sizes.values()), dim=-1)


class VocabEmbedding(nn.Module):
    """Token embedding; shards by vocabulary rows under tensor parallelism."""

    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(vocab_size, dim, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


def rope_inv_freq(
    rope: RopeConfig, head_dim: int, hidden_size: int, num_heads: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float32, CPU) and the cos/sin scale, exactly as transformers computes them."""
    if rope.type == "default":
        inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    # The scaled variants come from transformers' own utility (a pure function
    # of the config), so llama3/yarn/linear scaling match to the bit.
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    proxy = LlamaConfig(  # type: ignore[call-arg]
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope.theta,
        rope_scaling={"rope_type": rope.type, **dict(rope.params)},
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope.type](proxy, torch.device("cpu"))
    return inv_freq.to(torch.float32), float(scale)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the non-interleaved "rotate half" layout).

    cos/sin are cached for every position up to `max_positions` as float32
    buffers on the default device; a forward gathers rows by position, so it
    needs no host sync and works for any mix of positions in a batch.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    kernels: TorchKernels = TORCH_KERNELS

    def __init__(
        self, rope: RopeConfig, head_dim: int, hidden_size: int, num_heads: int, max_positions: int
    ) -> None:
        super().__init__()
        device = torch.empty(0).device  # the builder's default device (meta, cuda, cpu)
        # Same float32 ops as transformers (position * inv_freq, then cos/sin), done
        # once on the CPU even when the model is built on the meta device.
        with torch.device("cpu"):
            inv_freq, scale = rope_inv_freq(rope, head_dim, hidden_size, num_heads, max_positions)
            freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
            cos, sin = freqs.cos() * scale, freqs.sin() * scale
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q `[T, Hq, D]`, k `[T, Hkv, D]`, positions `[T]`."""
        return self.kernels.rope(positions, q, k, self.cos, self.sin)
