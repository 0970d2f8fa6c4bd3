"""Writing a step's new K and V into the pool in one kernel launch, rotating q and k on the way.

`KVPool.write` is two indexed assignments per layer (K, then V): 48 kernel
launches per step on a 24-layer model, each a few microseconds even inside a
CUDA graph (H200 profile, qwen2.5-0.5b at batch 32: 149 us of a 1.7 ms step),
and each a Python launch in eager steps. One Triton program per new token
copies both rows instead. It reads K and V as strided views of the fused qkv
output (no copies) and writes the pool's `[slots, Hkv, D]` rows at `slots`.

An FP8 pool (cache/kv_quant.py) is the kernel's `FP8` switch: each row is divided
by its layer's scale, saturated to +-448 and rounded to nearest even onto the e4m3
grid in float32 (`fp8_quant.round_e4m3`) before the cast, so the stored bytes equal
`kv_quant.quantize`'s, whatever rounding the cast itself does (Triton's interpreter
drops the carry of a mantissa that rounds up into the next power of two).

`rope_store_kv` also applies the layer's rotary embedding (`Rope`: float32 cos/sin
tables over the leading R dims of a head, "rotate half" layout) in the same program:
q rotated in place, k rotated on its way into the pool, v copied. That is one launch
where a rope kernel (reading and writing q and k) and the store (reading k and v)
were two, and k is read once. It computes in float32 and rounds once, as FlashInfer's
rope does, so bf16 results differ from the reference (`TorchKernels.rope`, transformers'
arithmetic in the model dtype) by rounding.

Used by the GPU backends when triton is installed and the dtypes match (or the pool
is FP8); everything else (the CPU, a float32 model over a bf16 pool) keeps the model's
rope op and `KVPool.write` (kv_store_select.py). The Triton backends' CPU tests run
these kernels under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.cache.kv_pool import KVPool
from radixserve.cache.kv_quant import FP8_MAX
from radixserve.runtime.attention.rope import Rope
from radixserve.runtime.fp8_quant import quantized


@triton.jit
def _rotated_halves(ptr, mask, cos, sin, HALF: tl.constexpr):
    """The rotated halves (x1 * cos - x2 * sin, x2 * cos + x1 * sin) in float32 of the rows
    at `ptr` (first halves; the second are HALF further). Both come from the same thread that
    stores them, so rotating in place races with no other thread."""
    x1 = tl.load(ptr, mask=mask).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask).to(tl.float32)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :]


@triton.jit
def _store_kernel(
    Q,
    K,
    V,
    K_cache,
    V_cache,
    slots,
    positions,
    COS,
    SIN,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cn,
    stride_ch,
    stride_pos,
    k_scale,
    v_scale,
    Q_HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    REST: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
    FP8_LIMIT: tl.constexpr,
):
    """One token: its k and v into the pool at its slot, the leading 2 * HALF dims of q (in
    place) and k rotated by its position on the way (HALF = 0: a plain store; q unused)."""
    t = tl.program_id(0)
    slot = tl.load(slots + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_HKV)
    k_row = K + t * stride_kt + offs_h[:, None] * stride_kh
    dst = K_cache + slot * stride_cn + offs_h[:, None] * stride_ch
    if HALF > 0:
        pos = tl.load(positions + t).to(tl.int64)
        offs_i = tl.arange(0, BLOCK_HALF)
        cos = tl.load(COS + pos * stride_pos + offs_i, mask=offs_i < HALF, other=1.0)
        sin = tl.load(SIN + pos * stride_pos + offs_i, mask=offs_i < HALF, other=0.0)
        # q in place: its rotated dims only (the rest pass through untouched).
        offs_hq = tl.arange(0, BLOCK_HQ)
        mask_q = (offs_hq[:, None] < Q_HEADS) & (offs_i[None, :] < HALF)
        q_ptr = Q + t * stride_qt + offs_hq[:, None] * stride_qh + offs_i[None, :]
        q1, q2 = _rotated_halves(q_ptr, mask_q, cos, sin, HALF)
        tl.store(q_ptr, q1.to(Q.dtype.element_ty), mask=mask_q)
        tl.store(q_ptr + HALF, q2.to(Q.dtype.element_ty), mask=mask_q)
        # k rotated into the pool, rounded to the model's dtype first as a separate rope leaves it.
        mask_k = (offs_h[:, None] < KV_HEADS) & (offs_i[None, :] < HALF)
        k1, k2 = _rotated_halves(k_row + offs_i[None, :], mask_k, cos, sin, HALF)
        k1, k2 = k1.to(K.dtype.element_ty), k2.to(K.dtype.element_ty)
        if FP8:
            k1, k2 = quantized(k1, k_scale, FP8_LIMIT), quantized(k2, k_scale, FP8_LIMIT)
        tl.store(dst + offs_i[None, :], k1.to(K_cache.dtype.element_ty), mask=mask_k)
        tl.store(dst + HALF + offs_i[None, :], k2.to(K_cache.dtype.element_ty), mask=mask_k)
    if REST > 0:  # the dims past the rotated ones (all of them in a plain store), as they are
        offs_r = tl.arange(0, BLOCK_REST)
        mask_r = (offs_h[:, None] < KV_HEADS) & (offs_r[None, :] < REST)
        kr = tl.load(k_row + 2 * HALF + offs_r[None, :], mask=mask_r)
        if FP8:
            kr = quantized(kr, k_scale, FP8_LIMIT)
        tl.store(dst + 2 * HALF + offs_r[None, :], kr.to(K_cache.dtype.element_ty), mask=mask_r)
    offs_d = tl.arange(0, BLOCK_D)
    mask_v = (offs_h[:, None] < KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask_v)
    if FP8:
        v = quantized(v, v_scale, FP8_LIMIT)
    v_dst = V_cache + slot * stride_cn + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(v_dst, v.to(V_cache.dtype.element_ty), mask=mask_v)


def _kernel_takes(pool: KVPool, layer: int, *rows: torch.Tensor) -> bool:
    """The kernel reads rows with dense last dims, of the pool's dtype (any, for an FP8 pool)."""
    same = pool.config.fp8 or all(x.dtype == pool.k[layer].dtype for x in rows)
    return same and all(x.stride(-1) == 1 for x in rows)


def store_kv(pool: KVPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """`pool.write(layer, slots, k, v)` in one launch (`k`, `v`: `[T, Hkv, D]`, rows may be strided)."""
    if not _kernel_takes(pool, layer, k, v):
        pool.write(layer, slots, k, v)
        return
    _launch(pool, layer, slots, k, v, None)


def rope_store_kv(
    pool: KVPool,
    layer: int,
    slots: torch.Tensor,
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: Rope | None,
) -> torch.Tensor:
    """q and k rotated by `positions` (`rope` None: they come rotated), k and v stored at `slots`
    (`[T, H, D]`, rows may be strided): one launch. Returns q, rotated in place (or anew, where a
    layout the kernel does not take falls back to `rope.apply` and `store_kv`)."""
    if rope is None:
        store_kv(pool, layer, slots, k, v)
        return q
    # Float32 tables of one layout (the kernel reads both at cos's row stride), dense rows.
    tables = rope.cos.dtype == rope.sin.dtype == torch.float32 and rope.cos.stride() == rope.sin.stride()
    tables = tables and rope.cos.stride(-1) == 1
    if not (tables and q.dtype == k.dtype and _kernel_takes(pool, layer, q, k, v)):
        q, k = rope.apply(positions, q, k, rope.cos, rope.sin)
        store_kv(pool, layer, slots, k, v)
        return q
    _launch(pool, layer, slots, k, v, (positions, q, rope.cos, rope.sin))
    return q


def _launch(
    pool: KVPool,
    layer: int,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rotate: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> None:
    """`_store_kernel` over the tokens; `rotate`: (positions, q, cos, sin), None for a plain store."""
    n = k.shape[0]
    if n == 0:
        return
    k_cache, v_cache = pool.k[layer], pool.v[layer]
    kv_heads, head_dim = k.shape[1], k.shape[2]
    # A plain store passes k for q and slots for the tables: pointers the kernel never reads.
    positions, q, cos, sin = rotate if rotate is not None else (slots, k, slots, slots)
    half = cos.shape[-1] if rotate is not None else 0
    q_heads, rest = q.shape[1], head_dim - 2 * half
    _store_kernel[(n,)](
        q,
        k,
        v,
        k_cache,
        v_cache,
        slots,
        positions,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        cos.stride(0),
        pool.config.k_scale(layer),
        pool.config.v_scale(layer),
        Q_HEADS=q_heads,
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        HALF=half,
        REST=rest,
        BLOCK_HQ=triton.next_power_of_2(q_heads),
        BLOCK_HKV=triton.next_power_of_2(kv_heads),
        BLOCK_HALF=triton.next_power_of_2(max(half, 1)),
        BLOCK_REST=triton.next_power_of_2(max(rest, 1)),
        BLOCK_D=triton.next_power_of_2(head_dim),
        FP8=pool.config.fp8,
        FP8_LIMIT=FP8_MAX,
        num_warps=1 if max(q_heads, kv_heads) * head_dim <= 512 else 4,
    )
