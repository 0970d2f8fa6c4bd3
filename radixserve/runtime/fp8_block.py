"""The block-scaled FP8 linear: float8_e4m3fn weights with one float32 scale per
`[block_n, block_k]` tile, activations quantized per token in groups of `block_k` columns.

This is the layout of transformers' fine-grained FP8 (`weight_block_size`, `weight_scale_inv`)
that DeepSeek-V3 and the Qwen3 FP8 releases use, with 128 x 128 blocks. Over the column
group g of token m and the block (n // block_n, g) of the weight:

    y[m, n] = sum_g (q(x)[m, g] * s_x[m, g]) . (W_q[n, g] * s_w[n // block_n, g]) + b[n]

where `q(x)[m, g]` rounds the group to float8_e4m3fn after scaling it by
`s_x[m, g] = absmax(group) / 448` (fp8_format's products, as the per-row quantizer does).

- On CUDA (Hopper, compute capability 9.x; `check_block_device`): the groups quantized with a
  few torch ops (no host sync: CUDA graphs capture them), then one
  `torch.nn.functional.scaled_mm` with `BlockWise1x128` activation scales and
  `BlockWise128x128` weight scales (cuBLASLt >= 12.9), the bias added after it. Only
  128 x 128 blocks and dims that are whole blocks (`check_block_shape`).
- Elsewhere `reference_block_linear`, the specification: the same quantized groups turned back
  into floats, the weight dequantized block by block, one float32 matmul (what transformers
  computes with dequantized weights and inputs fake-quantized per token group).

The weight's scales are stored `[ceil(N / block_n), round_up(ceil(K / block_k), 4)]`: the
checkpoint's columns first, then zero columns that no K block reads. cuBLAS wants the scales'
K dim padded to four (`block_scales`), and one stored layout serves both paths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.runtime.fp8_format import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_AMAX

# The one block the CUDA GEMM takes (cuBLAS's DeepSeek-style recipe).
GPU_BLOCK = (128, 128)
# cuBLAS reads the weight scales' K dim and the activation scales' token dim in fours.
_SCALE_ALIGN = 4


def block_count(size: int, block: int) -> int:
    return -(-size // block)


def scale_columns(in_features: int, block_k: int) -> int:
    """Stored columns of a weight's block scales: its K blocks, padded to `_SCALE_ALIGN`."""
    kb = block_count(in_features, block_k)
    return -(-kb // _SCALE_ALIGN) * _SCALE_ALIGN


def block_scales(checkpoint: torch.Tensor, in_features: int, block_k: int) -> torch.Tensor:
    """A checkpoint's `[Nb, Kb]` block scales in the stored layout (float32, zero-padded columns)."""
    kb = block_count(in_features, block_k)
    if checkpoint.dim() != 2 or checkpoint.shape[1] != kb:
        return checkpoint.float()  # the loader's shape check names the tensor
    return F.pad(checkpoint.float(), (0, scale_columns(in_features, block_k) - kb))


def quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn `[M, K]`, float32 scales `[M, ceil(K / group)]`) of the rows of `x`, each
    row quantized in groups of `group` columns (the last one may be shorter)."""
    m, k = x.shape
    kb = block_count(k, group)
    padded = F.pad(x, (0, kb * group - k)) if k % group else x
    g = padded.reshape(m, kb, group)  # a strided input (a view of q/k/v) is copied
    amax = g.abs().amax(dim=-1, keepdim=True).float()
    scale = amax.clamp(min=MIN_AMAX) * INV_FP8_MAX  # products, not divisions: see fp8_format
    values = (g.float() * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values.view(m, kb * group)[:, :k], scale.view(m, kb)


def dequantize_block_weight(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """The float32 weight that an FP8 `weight [N, K]` and its stored block `scale` stand for."""
    n, k = weight.shape
    bn, bk = block
    s = scale[:, : block_count(k, bk)]
    full = s.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return weight.float() * full


def fake_quantize_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """`x [..., K]` quantized per token in groups of `group` columns and back, in float32."""
    rows = x.reshape(-1, x.shape[-1])
    values, scale = quantize_groups(rows, group)
    k = rows.shape[1]
    full = scale.repeat_interleave(group, dim=1)[:, :k]
    return (values.float() * full).view(x.shape)


def reference_block_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The CPU path and the CUDA path's specification (see the module doc)."""
    w = dequantize_block_weight(weight, scale, block)
    y = F.linear(fake_quantize_groups(x, block[1]), w, None if bias is None else bias.float())
    return y.to(x.dtype)


def block_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`x [..., K]` times a block-scaled FP8 `weight [N, K]`, plus `bias`."""
    if x.is_cuda:
        return block_scaled_mm_linear(x, weight, scale, bias)
    return reference_block_linear(x, weight, scale, block, bias)


def block_scaled_mm_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """One DeepSeek-style scaled GEMM on CUDA: 1 x 128 activation groups, 128 x 128 weight
    blocks. The activation scales go in column-major (cuBLAS's layout), their token count
    padded to `_SCALE_ALIGN` with zero rows that are dropped from the output."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    pad = -m % _SCALE_ALIGN
    if pad:  # a shape, not a value: CUDA graphs keep the branch they were captured with
        rows = F.pad(rows, (0, 0, 0, pad))
    values, s_x = quantize_groups(rows, GPU_BLOCK[1])
    y = F.scaled_mm(
        values,
        weight.t(),
        s_x.t().contiguous().t(),
        F.ScalingType.BlockWise1x128,
        scale.t(),
        F.ScalingType.BlockWise128x128,
        output_dtype=x.dtype,
    )
    if pad:
        y = y[:m]
    if bias is not None:
        y = y + bias
    return y.view(*lead, weight.shape[0])


def check_block_device(capability: tuple[int, int], device: str) -> None:
    """Refuse block-scaled FP8 where its GEMM does not run: cuBLAS's block-scaled recipe is
    Hopper's alone, and it came with `torch.nn.functional.scaled_mm`."""
    if capability[0] != 9:
        major, minor = capability
        raise ValueError(
            f"block-wise FP8 weights (quantization_config.weight_block_size) run on Hopper GPUs "
            f"(compute capability 9.x) here; {device} has {major}.{minor}. Use a per-channel FP8 "
            "checkpoint, or the bf16 checkpoint with quantization='fp8'"
        )
    if not hasattr(F, "scaled_mm"):  # an API that older torch lacks, not a capability of ours
        raise ValueError(
            f"block-wise FP8 weights need torch.nn.functional.scaled_mm (torch >= 2.10); "
            f"this is torch {torch.__version__}"
        )


def check_block_shape(name: str, out_features: int, in_features: int, block: tuple[int, int]) -> None:
    """On CUDA: 128 x 128 blocks, and a linear whose dims are whole blocks."""
    if block != GPU_BLOCK:
        raise ValueError(
            f"FP8 linear {name} has {block[0]}x{block[1]} weight blocks: the CUDA block-scaled GEMM "
            f"takes {GPU_BLOCK[0]}x{GPU_BLOCK[1]} only"
        )
    if out_features % block[0] or in_features % block[1]:
        raise ValueError(
            f"FP8 linear {name} is {out_features}x{in_features}: the CUDA block-scaled GEMM needs "
            f"both dims multiples of {block[0]}"
        )
