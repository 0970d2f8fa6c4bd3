"""Writing a step's new K and V into the pool in one kernel launch.

`KVPool.write` is two indexed assignments per layer (K, then V): 48 kernel
launches per step on a 24-layer model, each a few microseconds even inside a
CUDA graph (H200 profile, qwen2.5-0.5b at batch 32: 149 us of a 1.7 ms step),
and each a Python launch in eager steps. One Triton program per new token
copies both rows instead. It reads K and V as strided views of the fused qkv
output (no copies) and writes the pool's `[slots, Hkv, D]` rows at `slots`.

An FP8 pool (cache/kv_quant.py) is the kernel's `FP8` switch: each row is divided
by its layer's scale, saturated to +-448 and rounded to nearest even onto the e4m3
grid in float32 (`_round_e4m3`) before the cast, so the stored bytes equal
`kv_quant.quantize`'s, whatever rounding the cast itself does (Triton's interpreter
drops the carry of a mantissa that rounds up into the next power of two).

Used by the GPU backends when triton is installed and the dtypes match (or the pool
is FP8); everything else (the CPU, a float32 model over a bf16 pool) keeps
`KVPool.write`. The Triton backend's CPU tests run it under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.cache.kv_pool import KVPool
from radixserve.cache.kv_quant import FP8_MAX


@triton.jit
def _round_e4m3(x):
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
def _quantized(x, scale, FP8_LIMIT: tl.constexpr):
    y = tl.clamp(x.to(tl.float32) / scale, -FP8_LIMIT, FP8_LIMIT)
    return _round_e4m3(y)


@triton.jit
def _store_kv_kernel(
    K,
    V,
    K_cache,
    V_cache,
    slots,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cn,
    stride_ch,
    k_scale,
    v_scale,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
    FP8_LIMIT: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slots + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < HEADS) & (offs_d[None, :] < HEAD_DIM)
    dst = slot * stride_cn + offs_h[:, None] * stride_ch + offs_d[None, :]
    k = tl.load(K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    if FP8:
        k = _quantized(k, k_scale, FP8_LIMIT)
    tl.store(K_cache + dst, k.to(K_cache.dtype.element_ty), mask=mask)
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    if FP8:
        v = _quantized(v, v_scale, FP8_LIMIT)
    tl.store(V_cache + dst, v.to(V_cache.dtype.element_ty), mask=mask)


def store_kv(pool: KVPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """`pool.write(layer, slots, k, v)` in one launch (`k`, `v`: `[T, Hkv, D]`, rows may be strided)."""
    k_cache, v_cache = pool.k[layer], pool.v[layer]
    n = k.shape[0]
    if n == 0:
        return
    fp8 = pool.config.fp8
    same = fp8 or (k.dtype == k_cache.dtype and v.dtype == v_cache.dtype)
    if not same or k.stride(-1) != 1 or v.stride(-1) != 1:
        pool.write(layer, slots, k, v)
        return
    heads, head_dim = k.shape[1], k.shape[2]
    _store_kv_kernel[(n,)](
        k,
        v,
        k_cache,
        v_cache,
        slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        pool.config.k_scale(layer),
        pool.config.v_scale(layer),
        HEADS=heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        FP8=fp8,
        FP8_LIMIT=FP8_MAX,
        num_warps=1 if heads * head_dim <= 512 else 4,
    )
