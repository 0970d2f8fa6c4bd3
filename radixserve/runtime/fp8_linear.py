"""The FP8 linear: float8_e4m3fn weights with a float32 scale per output row, activations
quantized per token as they come.

`y = (q(x) * s_x) (W_q * s_w)^T + b`, where `q(x)` rounds each row of `x` to
float8_e4m3fn after dividing it by `s_x = absmax(row) / 448` (448: the largest
e4m3fn value; both divisions computed as float32 products, see fp8_format), and
`W_q`, `s_w` come from the checkpoint or from `quantize_rows` over the weight at load.
One function quantizes weights and activations alike, so both paths round the same way:

- on CUDA (compute capability >= 8.9, triton installed) the activation quantized by
  one Triton launch (fp8_quant.quantize_tokens: the same bytes and scales as
  `quantize_rows`), then one `torch._scaled_mm` with row-wise scales (`scale_a [M, 1]`,
  `scale_b [1, N]`) and the bias in its epilogue: no host sync, so CUDA graphs capture it;
- elsewhere `reference_linear`, the specification of the GPU path: the same
  quantized activation turned back into floats, the dequantized weight, one float32
  matmul (what transformers computes with dequantized weights and per-token
  fake-quantized inputs), cast to the activation's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from radixserve.runtime.fp8_format import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_AMAX

# The least compute capability with FP8 tensor cores (Ada 8.9, Hopper 9.0 and later).
MIN_CAPABILITY = (8, 9)
# `_scaled_mm` wants K and N multiples of 16 (the second operand column-major).
GEMM_ALIGN = 16
# Row-wise scaled GEMMs write bfloat16 or float16 (float32 only through some cuBLAS versions).
CUDA_DTYPES = (torch.bfloat16, torch.float16)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn values, float32 scales `[..., 1]`) of each row of `t`, so that
    `values.float() * scales` approximates `t`: scale = absmax(row) / 448, in float32, as
    fp8_format computes it."""
    amax = t.abs().amax(dim=-1, keepdim=True).float()
    scale = amax.clamp(min=MIN_AMAX) * INV_FP8_MAX  # products, not divisions: see fp8_format
    values = (t.float() * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values, scale


# `[M, K]` -> (float8_e4m3fn `[M, K]` row-major, float32 scales `[M, 1]`): `quantize_rows`, or
# fp8_quant.quantize_tokens (the same bytes in one Triton launch).
Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A `[N, K]` weight as float8_e4m3fn and its per-output-channel scales `[N]`."""
    values, scale = quantize_rows(weight)
    return values, scale.view(-1)


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight that `weight` (FP8 `[N, K]`) and `scale` (`[N]`) stand for."""
    return weight.float() * scale.view(-1, 1)


def fake_quantize(x: torch.Tensor) -> torch.Tensor:
    """`x` quantized per row (token) to FP8 and back, in float32."""
    values, scale = quantize_rows(x)
    return values.float() * scale


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`x [..., K]` times an FP8 `weight [N, K]` with per-row `scale [N]`, plus `bias`."""
    if x.is_cuda:
        return scaled_mm_linear(x, weight, scale, bias, cuda_quantizer())
    return reference_linear(x, weight, scale, bias)


def fp8_silu_mul_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`fp8_linear(silu(gate) * up, ...)` of a CUDA gate/up output `[..., 2 * I]`: the activation
    and the input's quantization in one launch (fp8_quant.silu_mul_quantize_tokens)."""
    return scaled_mm_linear(gate_up, weight, scale, bias, cuda_quantizer(silu_mul=True))


def fp8_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, plus_one: bool
) -> tuple[QuantizedRows, torch.Tensor]:
    """(norm(residual + x) quantized for an FP8 linear, residual + x) of CUDA rows `[M, K]`, the
    residual updated in place, in one launch (fp8_quant.add_rms_norm_quantize_tokens): the residual
    add and norm before a layer's FP8 projection without the normed row's round trip."""
    values, scales = _cuda_kernels().add_rms_norm_quantize_tokens(x, residual, weight, eps, plus_one)
    return QuantizedRows(values, scales, residual.dtype), residual


def cuda_quantizer(silu_mul: bool = False) -> Quantizer:
    """fp8_quant.quantize_tokens, or (`silu_mul`) its SiLU·mul form over a gate/up output."""
    kernels = _cuda_kernels()
    return kernels.silu_mul_quantize_tokens if silu_mul else kernels.quantize_tokens


@functools.cache
def _cuda_kernels() -> ModuleType:
    """runtime/fp8_quant.py, imported on first use (it imports triton, which the CPU may lack;
    cached: an import statement per linear per eager step cost ~0.6 us, this ~35 ns)."""
    from radixserve.runtime import fp8_quant

    return fp8_quant


def reference_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The CPU path and the GPU path's specification (see the module doc)."""
    w = dequantize_weight(weight, scale)
    y = F.linear(fake_quantize(x), w, None if bias is None else bias.float())
    return y.to(x.dtype)


def scaled_mm_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    quantize: Quantizer = quantize_rows,
) -> torch.Tensor:
    """One row-wise scaled FP8 GEMM (`torch._scaled_mm`): x quantized per row by `quantize`
    (row-major), the weight's transpose a column-major view of the stored `[N, K]` rows, fp32
    scales, the output in x's dtype (bfloat16 or float16 on CUDA; checked at load)."""
    lead = x.shape[:-1]
    values, scales = quantize(x.reshape(-1, x.shape[-1]))
    y = quantized_linear(QuantizedRows(values, scales, x.dtype), weight, scale, bias)
    return y.view(*lead, weight.shape[0])


@dataclass(frozen=True)
class QuantizedRows:
    """An activation already quantized per token for an FP8 linear, by a kernel that fused its
    quantizer into the op before (fp8_quant.add_rms_norm_quantize_tokens): what the linear's own
    quantizer would have made of the `[M, K]` rows."""

    values: torch.Tensor  # float8_e4m3fn [M, K], row-major
    scales: torch.Tensor  # float32 [M, 1]: row i stands for values[i].float() * scales[i]
    dtype: torch.dtype  # the unquantized activation's dtype, which the linear's output takes


def quantized_linear(
    rows: QuantizedRows, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`[M, N]` in `rows.dtype`: one row-wise scaled GEMM of quantized rows and an FP8 `weight [N, K]`
    (its transpose a column-major view of the stored rows) with per-row `scale [N]`, plus `bias`."""
    return torch._scaled_mm(
        rows.values,
        weight.t(),
        scale_a=rows.scales,
        scale_b=scale.view(1, -1),
        bias=bias,
        out_dtype=rows.dtype,
    )


def check_capability(capability: tuple[int, int], device: str) -> None:
    """Refuse FP8 weights on a GPU without FP8 tensor cores (`torch.cuda.get_device_capability`)."""
    if tuple(capability) < MIN_CAPABILITY:
        major, minor = capability
        raise ValueError(
            f"quantization='fp8' (FP8 weights) needs a GPU of compute capability >= 8.9 "
            f"(Ada, Hopper or newer); {device} has {major}.{minor}. Load the model unquantized "
            "(quantization=None and a bf16 checkpoint) on this GPU"
        )
