"""Building blocks of the decoder: norm, rotary embedding, linear layers.

Parameters are created with `torch.empty` in the given dtype on the current
default device (the loader builds under `with torch.device(...)`), so a model
is never initialised twice: the loader fills the weights from a checkpoint or
with dummy values. Parameters never require grad: this is an inference engine.

The elementwise ops (norm, rotary, activation) come from the module's
`kernels` (runtime/kernels.py): the reference follows transformers' modeling
code operation for operation (same casts, same order) so float32 results
agree to rounding; on a GPU `use_kernels` swaps in FlashInfer's fused ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.model.options import RopeConfig
from radixserve.model.rope import rope_tables
from radixserve.runtime.attention.rope import Rope
from radixserve.runtime.fp8_block import block_count, block_linear, block_scales, scale_columns
from radixserve.runtime.fp8_linear import (
    FP8_DTYPE,
    QuantizedRows,
    fp8_add_rms_norm,
    fp8_linear,
    fp8_silu_mul_linear,
    quantize_weight,
    quantized_linear,
)
from radixserve.runtime.kernels import TORCH_KERNELS, TorchKernels
from radixserve.runtime.matmul import DEFAULT_MATMUL, Matmul


def frozen_param(*shape: int, dtype: torch.dtype, fill: float | None = None) -> nn.Parameter:
    data = torch.empty(*shape, dtype=dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
    return nn.Parameter(data, requires_grad=False)


class RMSNorm(nn.Module):
    """RMSNorm scaled by `weight`, or by `1 + weight` (`plus_one`: Gemma's checkpoints
    store the offset from one; the weight stays as stored, the kernel adds the one)."""

    kernels: TorchKernels = TORCH_KERNELS

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, plus_one: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.plus_one = plus_one
        self.weight = frozen_param(dim, dtype=dtype, fill=self.unit_weight)

    @property
    def unit_weight(self) -> float:
        """The stored weight that scales by one."""
        return 0.0 if self.plus_one else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.plus_one:
            return self.kernels.gemma_rms_norm(x, self.weight, self.eps)
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x); the fused kernel reuses both buffers."""
        if self.plus_one:
            return self.kernels.gemma_add_rms_norm(x, residual, self.weight, self.eps)
        return self.kernels.add_rms_norm(x, residual, self.weight, self.eps)

    def add_quantize_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[QuantizedRows, torch.Tensor]:
        """`add_forward` of CUDA rows with the output quantized for the FP8 linear it feeds, in one
        kernel; the caller checks the device and the width (fp8_format.NORM_FUSE_MAX_WIDTH)."""
        return fp8_add_rms_norm(x, residual, self.weight, self.eps, self.plus_one)


class MatmulUser(nn.Module):
    """A module whose products go through `matmul` (runtime/matmul.py): the library's by
    default, a batch-invariant one in deterministic mode (`use_matmul`)."""

    matmul: Matmul = DEFAULT_MATMUL


def use_matmul(model: nn.Module, matmul: Matmul) -> None:
    """Point every product of `model` at `matmul`, once, after loading."""
    for m in model.modules():
        if isinstance(m, MatmulUser):
            m.matmul = matmul


class Linear(MatmulUser):
    """`y = x W^T + b`. The unit tensor parallelism will shard: a column-parallel
    linear keeps a slice of the output features, a row-parallel one a slice of
    the input features and all-reduces.

    FP8 (`to_fp8` before a quantized checkpoint fills it, `quantize_fp8_` after a
    high-precision one did): the weight is float8_e4m3fn with a float32 scale per
    output row (`weight_scale`), the bias stays in the model dtype, and the forward is
    runtime/fp8_linear.py's (activations quantized per token). With `weight_block`
    (`to_fp8(block)`, a block-scaled checkpoint) `weight_scale` holds one scale per
    `[block_n, block_k]` tile and the forward is runtime/fp8_block.py's."""

    weight_scale: nn.Parameter | None
    weight_block: tuple[int, int] | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = frozen_param(out_features, in_features, dtype=dtype)
        self.bias = frozen_param(out_features, dtype=dtype) if bias else None
        self.register_parameter("weight_scale", None)

    @property
    def is_fp8(self) -> bool:
        return self.weight_scale is not None

    @property
    def row_scaled_fp8(self) -> bool:
        """FP8 with a scale per output row: its input quantized per token, by its own Triton
        quantizer on CUDA or by a kernel fused into the op before (not block-scaled linears)."""
        return self.is_fp8 and self.weight_block is None

    def to_fp8(self, block: tuple[int, int] | None = None) -> None:
        """Empty FP8 weight and scales of this shape, for a checkpoint's quantized tensors: a
        scale per output row, or (`block`) per `[block_n, block_k]` tile."""
        device = self.weight.device
        self.weight = nn.Parameter(
            torch.empty(self.out_features, self.in_features, dtype=FP8_DTYPE, device=device),
            requires_grad=False,
        )
        shape: tuple[int, ...] = (self.out_features,)
        if block is not None:
            shape = (block_count(self.out_features, block[0]), scale_columns(self.in_features, block[1]))
        self.weight_scale = nn.Parameter(
            torch.zeros(shape, dtype=torch.float32, device=device), requires_grad=False
        )
        self.weight_block = block

    def checkpoint_scale(self, tensor: torch.Tensor) -> torch.Tensor:
        """A checkpoint's scale tensor in this FP8 linear's stored layout."""
        if self.weight_block is None:
            return tensor.float().reshape(-1)  # `[out, 1]` as `[out]`; per tensor `[1]`
        return block_scales(tensor, self.in_features, self.weight_block[1])

    @torch.no_grad()
    def quantize_fp8_(self) -> None:
        """Quantize the loaded weight in place: per output channel, absmax / 448."""
        weight, scale = quantize_weight(self.weight.data)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        """`x` may come quantized already (`QuantizedRows`, from a norm fused with the quantizer)
        when this linear is FP8."""
        if isinstance(x, QuantizedRows):
            assert self.weight_scale is not None, "quantized rows feed FP8 linears only"
            return quantized_linear(x, self.weight, self.weight_scale, self.bias)
        if self.weight_block is not None:
            assert self.weight_scale is not None
            return block_linear(x, self.weight, self.weight_scale, self.weight_block, self.bias)
        if self.weight_scale is not None:
            return fp8_linear(x, self.weight, self.weight_scale, self.bias)
        return self.matmul.linear(x, self.weight, self.bias)

    def silu_mul_forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """This FP8 linear over `silu(gate) * up` of a CUDA gate/up output, the activation fused
        into the input's quantization; the caller checks `is_fp8` and the device."""
        assert self.weight_scale is not None and gate_up.is_cuda
        return fp8_silu_mul_linear(gate_up, self.weight, self.weight_scale, self.bias)


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

    def scale_rows(self, part: str) -> slice:
        """Rows of `weight_scale` that hold `part`: its output rows, or with block scales its
        row blocks (each part whole blocks: `to_fp8` checks)."""
        if self.weight_block is None:
            return self.part_rows(part)
        rows, bn = self.part_rows(part), self.weight_block[0]
        return slice(rows.start // bn, rows.stop // bn)

    def to_fp8(self, block: tuple[int, int] | None = None) -> None:
        if block is not None:
            split = {p: n for p, n in self.part_sizes.items() if n % block[0]}
            if split:
                raise ValueError(
                    f"block-wise FP8 scales of {block[0]} rows cannot stack the parts "
                    f"{', '.join(f'{p} ({n} rows)' for p, n in split.items())} of a fused projection: "
                    "each part must be whole blocks"
                )
        super().to_fp8(block)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(list(self.part_sizes.values()), dim=-1)


class VocabEmbedding(nn.Module):
    """Token embedding; shards by vocabulary rows under tensor parallelism."""

    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = frozen_param(vocab_size, dim, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the non-interleaved "rotate half" layout) over the
    leading `rotary_dim` dims of each head (all of them by default).

    cos/sin are cached for every position up to `max_positions` as float32
    buffers on the default device; the rotation gathers rows by position, so it
    needs no host sync and works for any mix of positions in a batch. The
    attention backend applies it (`rope`), where it writes the layer's K/V.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    kernels: TorchKernels = TORCH_KERNELS

    def __init__(
        self,
        rope: RopeConfig,
        head_dim: int,
        hidden_size: int,
        num_heads: int,
        max_positions: int,
        rotary_dim: int | None = None,
    ) -> None:
        super().__init__()
        device = torch.empty(0).device  # the builder's default device (meta, cuda, cpu)
        # Same float32 ops as transformers (position * inv_freq, then cos/sin), done
        # once on the CPU even when the model is built on the meta device.
        with torch.device("cpu"):
            dim = head_dim if rotary_dim is None else rotary_dim
            cos, sin = rope_tables(rope, dim, head_dim, hidden_size, num_heads, max_positions)
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)

    @property
    def rope(self) -> Rope:
        """The tables and this module's op, as an attention backend takes them: the backend
        rotates q and k where it stores K/V, in one kernel on a GPU (runtime/attention/kv_store.py)."""
        return Rope(self.cos, self.sin, self.kernels.rope)
