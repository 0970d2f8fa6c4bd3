"""Quantizing to float8_e4m3fn in Triton: the rounding both FP8 paths share, and the FP8 linear's
per-token activation quantizer.

`round_e4m3` rounds float32 onto the e4m3 grid to nearest even with exact bit arithmetic, so
the bytes a kernel stores equal torch's `.to(torch.float8_e4m3fn)` whatever rounding the cast
itself does (Triton's interpreter drops the carry of a mantissa that rounds up into the next
power of two). The K/V store (attention/kv_store.py) quantizes an FP8 pool's rows with it.

`quantize_tokens` is `fp8_linear.quantize_rows` for the CUDA FP8 linear's input, in one
launch: one program per token reads its row twice (absmax, then the rounded values; the second
read comes from L2) and writes the FP8 row and its float32 scale. The same quantization in
torch ops is nine launches, six of them over the whole `[tokens, K]`, most in float32 (on an
H100 at df32601, with those ops, FP8 weights gave 0.87x of bf16's W1L at 128/128, where half
the tokens are prefill; benchmarks/bench_fp8_linear.py times both quantizers per linear). Its
bytes and scales equal `quantize_rows`'s (tests/runtime/fp8_quant_cases.py), so the CPU
reference stays the GPU path's specification.

`silu_mul_quantize_tokens` is the same quantizer over `silu(gate) * up` of a gated MLP's
`[tokens, 2 * I]` gate/up output, for an FP8 down projection: the activation rounded to the
input's dtype, as the unfused kernel writes it, then quantized, so one launch replaces two and
the `[tokens, I]` activation is never written.

`add_rms_norm_quantize_tokens` is the residual add and RMSNorm before a layer's FP8 linear with
the quantizer in the same launch: the residual stream updated in place (as FlashInfer's fused
add + norm does), the normed row rounded to the stream's dtype in registers, quantized and
written as FP8 bytes and a scale. The normed bf16 row is never written nor read again.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from radixserve.runtime.fp8_format import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_AMAX, NORM_FUSE_MAX_WIDTH

# Triton's interpreter (the CPU tests) runs kernels as numpy, whose division rounds as IEEE's; it has
# no libdevice.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
# Columns a program handles per pass; a row of K columns takes ceil(K / BLOCK) of them.
MAX_BLOCK = 2048
# Warps per token: the SiLU·mul form reads two long rows (I = 14336 in llama-3.1-8b), one program
# per token, so a decode batch keeps few SMs busy unless each program is wide. On an H100 at 00abc56
# (benchmarks/sweep_fp8_quant.py), 16 warps took 0.72-0.73 of 4 warps' time at 16-128 tokens and
# 0.87-0.97 at 256-2048, and beat FlashInfer's SiLU·mul then the quantizer at every size (0.76-0.94);
# the plain quantizer's rows (K = 4096) gain nothing from 16 warps from 256 tokens on and lose 5-20%
# from 512.
WARPS = {False: 4, True: 16}


@triton.jit
def round_e4m3(x):
    """float32 `x` (within +-448) rounded to nearest even onto float8_e4m3fn's grid: the step
    is 2^(e - 3) for x in [2^e, 2^(e+1)), and 2^-9 below 2^-6 (subnormals). Exponents come from
    the bits, so every operation is exact."""
    e = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((127 - (e - 3)) << 23).to(tl.float32, bitcast=True)
    y = x * inv_step
    r = tl.floor(y)
    d = y - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)
    return tl.where(r == 0.0, x * 0.0, r * step)  # x * 0 keeps the sign of a zero, as a cast does


@triton.jit
def div_rn(a, b):
    """`a / b` in float32 rounded to nearest, as IEEE's (and torch's) division: compiled, Triton's
    `/` and `tl.fdiv(..., ieee_rounding=True)` alike are approximate (fp8_format says where it
    showed). A multi-instruction sequence: the quantizers take one reciprocal per row with it."""
    if _INTERPRETED:
        return a / b
    return libdevice.div_rn(a, b)


@triton.jit
def saturated_e4m3(y, FP8_LIMIT: tl.constexpr):
    """float32 `y` saturated to +-FP8_LIMIT and rounded onto the e4m3 grid."""
    return round_e4m3(tl.clamp(y, -FP8_LIMIT, FP8_LIMIT))


@triton.jit
def quantized(x, scale, FP8_LIMIT: tl.constexpr):
    """`x / scale` saturated and rounded onto the e4m3 grid, in float32 (the FP8 K/V store's)."""
    return saturated_e4m3(div_rn(x.to(tl.float32), scale), FP8_LIMIT)


@triton.jit
def _row_scale(amax, FLOOR: tl.constexpr, INV_LIMIT: tl.constexpr):
    """(scale, 1 / scale) of a row whose largest magnitude is `amax`: absmax * fl(1/448) and its
    exact reciprocal, the products fp8_format specifies."""
    scale = tl.maximum(amax, FLOOR) * INV_LIMIT
    return scale, div_rn(1.0, scale)


@triton.jit
def round_bf16(x):
    """float32 `x` rounded to nearest even onto bfloat16's grid, kept in float32: in bit arithmetic,
    as the cast on a GPU rounds (Triton's interpreter truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536: the high 16 bits
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def as_stored(x, dtype: tl.constexpr):
    """float32 `x` rounded to `dtype` (bfloat16, float16 or float32) as a store of it would round,
    kept in float32."""
    if dtype == tl.bfloat16:
        return round_bf16(x)
    return x.to(dtype).to(tl.float32)


@triton.jit
def _row_block(x_row, cols, mask, K, SILU_MUL: tl.constexpr):
    """One block of the row to quantize, in float32: the input's own values, or (`SILU_MUL`) silu of
    the gate half times the up half K columns on, rounded to the input's dtype as a separate
    activation kernel would store it."""
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if not SILU_MUL:
        return x
    up = tl.load(x_row + K + cols, mask=mask, other=0.0).to(tl.float32)
    return as_stored(x / (1.0 + tl.exp(-x)) * up, x_row.dtype.element_ty)  # exp is not torch's anyway


@triton.jit
def _token_quant_kernel(
    X,
    Q,
    S,
    K,
    stride_x,
    BLOCK: tl.constexpr,
    FP8_LIMIT: tl.constexpr,
    INV_LIMIT: tl.constexpr,
    FLOOR: tl.constexpr,
    SILU_MUL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    q_row = Q + row * K
    cols = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, K, BLOCK):
        mask = start + cols < K
        amax = tl.maximum(amax, tl.abs(_row_block(x_row, start + cols, mask, K, SILU_MUL)))
    scale, inv_scale = _row_scale(tl.max(amax, axis=0), FLOOR, INV_LIMIT)
    tl.store(S + row, scale)
    for start in range(0, K, BLOCK):
        mask = start + cols < K
        x = _row_block(x_row, start + cols, mask, K, SILU_MUL)
        q = saturated_e4m3(x * inv_scale, FP8_LIMIT)
        tl.store(q_row + start + cols, q.to(Q.dtype.element_ty), mask=mask)


def _outputs(m: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty FP8 rows `[m, k]` and their float32 scales `[m, 1]`."""
    values = torch.empty((m, k), dtype=FP8_DTYPE, device=device)
    return values, torch.empty((m, 1), dtype=torch.float32, device=device)


def launch_shape(k: int, silu_mul: bool) -> tuple[int, int]:
    """(columns per pass, warps per token) of the token quantizer over rows of `k` columns."""
    return min(triton.next_power_of_2(k), MAX_BLOCK), WARPS[silu_mul]


def token_quant(
    x: torch.Tensor, k: int, silu_mul: bool, shape: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rows `[M, k]` and their scales `[M, 1]` from `x [M, k]` (or `[M, 2k]` with `silu_mul`),
    launched at `shape` (default `launch_shape`; benchmarks/sweep_fp8_quant.py times others)."""
    m = x.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    values, scales = _outputs(m, k, x.device)
    if m == 0:
        return values, scales
    block, warps = shape or launch_shape(k, silu_mul)
    _token_quant_kernel[(m,)](
        x,
        values,
        scales,
        k,
        x.stride(0),
        BLOCK=block,
        FP8_LIMIT=FP8_MAX,
        INV_LIMIT=INV_FP8_MAX,
        FLOOR=MIN_AMAX,
        SILU_MUL=silu_mul,
        num_warps=warps,
    )
    return values, scales


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn `[M, K]` row-major, float32 scales `[M, 1]`) of a `[M, K]` activation whose
    rows may be strided (its last dim contiguous): `fp8_linear.quantize_rows`, one launch."""
    return token_quant(x, x.shape[1], silu_mul=False)


def silu_mul_quantize_tokens(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_tokens(silu(gate) * up)` of a `[M, 2 * I]` gate/up output (gate first, its rows may
    be strided), the activation rounded to `gate_up`'s dtype before it is quantized: one launch."""
    return token_quant(gate_up, gate_up.shape[1] // 2, silu_mul=True)


@triton.jit
def _add_norm_quant_kernel(
    X,
    R,
    W,
    Q,
    S,
    K,
    stride_x,
    stride_r,
    eps,
    BLOCK: tl.constexpr,
    FP8_LIMIT: tl.constexpr,
    INV_LIMIT: tl.constexpr,
    FLOOR: tl.constexpr,
    PLUS_ONE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    dtype = R.dtype.element_ty
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = as_stored(x + r, dtype)
    tl.store(R + row * stride_r + cols, h.to(dtype), mask=mask)
    rrms = tl.rsqrt(tl.sum(h * h, axis=0) / K + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if PLUS_ONE:  # Gemma: scaled by (1 + w) in float32, rounded once
        n = as_stored(h * rrms * (1.0 + w), dtype)
    else:  # transformers' Llama: the normed row rounded, then times the weight, rounded again
        n = as_stored(as_stored(h * rrms, dtype) * w, dtype)
    scale, inv_scale = _row_scale(tl.max(tl.abs(n), axis=0), FLOOR, INV_LIMIT)
    tl.store(S + row, scale)
    q = saturated_e4m3(n * inv_scale, FP8_LIMIT)
    tl.store(Q + row * K + cols, q.to(Q.dtype.element_ty), mask=mask)


def add_rms_norm_quantize_tokens(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, plus_one: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_tokens(norm(residual + x))` for `[M, K]` rows (K <= NORM_FUSE_MAX_WIDTH), `residual`
    updated in place to `residual + x` (rounded to its dtype); the norm scales by `weight`, or by
    `1 + weight` (`plus_one`), after transformers' Llama and Gemma norms. One launch."""
    m, k = residual.shape
    if k > NORM_FUSE_MAX_WIDTH:  # one program holds a whole row
        raise ValueError(
            f"rows of {k} columns: the fused add + norm + quantizer takes <= {NORM_FUSE_MAX_WIDTH}"
        )
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert residual.stride(-1) == 1, "the residual is updated in place: its rows must be contiguous"
    values, scales = _outputs(m, k, x.device)
    if m == 0:
        return values, scales
    block = triton.next_power_of_2(k)
    _add_norm_quant_kernel[(m,)](
        x,
        residual,
        weight,
        values,
        scales,
        k,
        x.stride(0),
        residual.stride(0),
        eps,
        BLOCK=block,
        FP8_LIMIT=FP8_MAX,
        INV_LIMIT=INV_FP8_MAX,
        FLOOR=MIN_AMAX,
        PLUS_ONE=plus_one,
        num_warps=min(max(block // 512, 1), 16),
    )
    return values, scales
