"""Cases for the one-launch rotary + K/V store (radixserve/runtime/attention/kv_store.py,
`rope_store_kv`) against the two steps it replaces: the reference rope (`TorchKernels.rope`,
in float32, rounded once to the model's dtype, as the kernel rounds) and `KVPool.write`.

q, k and v are strided views of one fused qkv output, positions and slots random; the pool's
other slots must stay as they were. Head counts that are not powers of two, a partial rotary
(R < head_dim: the other dims pass through), an FP8 pool (its bytes must equal the quantized
bf16 pool's, to the bit), an empty step and a layout the kernel does not take (a float32 model
over a bf16 pool: the writer falls back to the model's rope op) are each a case. Run on the
CPU under the interpreter (interpreted_cases.py) and on the GPU (test_rope_store.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.cache.kv_quant import FP8_KV_DTYPE, quantize
from radixserve.runtime.attention.kv_store import rope_store_kv
from radixserve.runtime.attention.kv_store_select import write_apart
from radixserve.runtime.attention.rope import Rope
from radixserve.runtime.kernels import TORCH_KERNELS

MAX_POS = 4096
SLOTS = 64


@dataclass(frozen=True)
class RopeCase:
    name: str
    dtype: torch.dtype  # the model's (q, k, v)
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    tokens: int
    pool_dtype: torch.dtype | None = None  # None: the model's


CASES = [
    RopeCase("float32", torch.float32, 4, 2, 64, 64, 5),
    RopeCase("bf16_gqa", torch.bfloat16, 8, 2, 32, 32, 7),
    RopeCase("partial_rotary_odd_heads", torch.float32, 6, 3, 32, 24, 4),
    RopeCase("partial_rotary_bf16", torch.bfloat16, 6, 3, 32, 24, 3),
    RopeCase("fp8_pool", torch.bfloat16, 4, 2, 32, 32, 6, FP8_KV_DTYPE),
    RopeCase("no_tokens", torch.bfloat16, 4, 2, 32, 32, 0),
    RopeCase("float32_over_bf16_pool", torch.float32, 4, 2, 32, 32, 3, torch.bfloat16),
]


def _pool(case: RopeCase, dtype: torch.dtype, device: str) -> KVPool:
    fp8 = dtype == FP8_KV_DTYPE
    cfg = KVPoolConfig(
        num_layers=2,
        num_kv_heads=case.kv_heads,
        head_dim=case.head_dim,
        dtype=dtype,
        device=device,
        compute_dtype=case.dtype if fp8 else None,
        k_scales=(1.0, 0.5) if fp8 else (),
        v_scales=(1.0, 0.3) if fp8 else (),
    )
    pool = KVPool(cfg, SLOTS)
    for buf in (*pool.k, *pool.v):  # a known fill, to see that other slots stay untouched
        buf.copy_(torch.full_like(buf, 0.5, dtype=torch.float32).to(buf.dtype))
    return pool


def _tables(rotary_dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.arange(MAX_POS, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos().to(device), freqs.sin().to(device)


def _float32_rope(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference arithmetic in float32, rounded once to the inputs' dtype."""
    rq, rk = TORCH_KERNELS.rope(positions, q.float(), k.float(), cos, sin)
    return rq.to(q.dtype), rk.to(k.dtype)


def _inputs(case: RopeCase, device: str, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A fused qkv output `[T, (Hq + 2 Hkv) * D]`, positions and distinct slots."""
    width = (case.q_heads + 2 * case.kv_heads) * case.head_dim
    qkv = (torch.randn(case.tokens, width, generator=gen) * 2).to(case.dtype).to(device)
    positions = torch.randint(0, MAX_POS, (case.tokens,), generator=gen).to(device)
    slots = torch.randperm(SLOTS - 1, generator=gen)[: case.tokens].to(device)
    return qkv, positions, slots


def _views(case: RopeCase, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as strided views of the qkv rows, as the model's projection hands them over."""
    hq, hk, d = case.q_heads, case.kv_heads, case.head_dim
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return q.unflatten(-1, (hq, d)), k.unflatten(-1, (hk, d)), v.unflatten(-1, (hk, d))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def run_case(case: RopeCase, device: str, seed: int) -> dict[str, float]:
    """Largest differences of the fused writer from the two steps, per part: q (rotated in
    place), k and v in the pool (layer 1), the untouched slots, and for an FP8 pool its bytes
    against the quantized bf16 pool's (0 when equal)."""
    gen = torch.Generator().manual_seed(seed)
    cos, sin = _tables(case.rotary_dim, device)
    qkv, positions, slots = _inputs(case, device, gen)
    pool_dtype = case.pool_dtype or case.dtype
    fused, ref = _pool(case, pool_dtype, device), _pool(case, pool_dtype, device)

    q, k, v = _views(case, qkv.clone())
    got_q = rope_store_kv(fused, 1, slots, positions, q, k, v, Rope(cos, sin, _float32_rope))
    rq, rk, rv = _views(case, qkv.clone())
    ref_q = write_apart(ref, 1, slots, positions, rq, rk, rv, Rope(cos, sin, _float32_rope))
    out = {"q": _max_diff(got_q, ref_q)}
    other = torch.ones(SLOTS, dtype=torch.bool, device=device)
    other[slots] = False
    for part, a, b in (("k", fused.k[1], ref.k[1]), ("v", fused.v[1], ref.v[1])):
        out[part] = _max_diff(a[slots], b[slots])
        out[f"{part}_untouched"] = _max_diff(a[other], b[other]) + _max_diff(fused.k[0], ref.k[0])
    if pool_dtype == FP8_KV_DTYPE:
        plain = _pool(case, case.dtype, device)
        q, k, v = _views(case, qkv.clone())
        rope_store_kv(plain, 1, slots, positions, q, k, v, Rope(cos, sin, _float32_rope))
        cfg = fused.config
        bytes_k = fused.k[1][slots].view(torch.uint8) != _quantize_like(plain.k[1][slots], cfg.k_scale(1))
        bytes_v = fused.v[1][slots].view(torch.uint8) != _quantize_like(plain.v[1][slots], cfg.v_scale(1))
        out["fp8_bytes_off"] = float(bytes_k.sum() + bytes_v.sum())
    return out


def _quantize_like(x: torch.Tensor, scale: float) -> torch.Tensor:
    return quantize(x, scale).view(torch.uint8)


def run_rope_store_cases(seed: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    return {case.name: run_case(case, device, seed) for case in CASES}


def tolerance(case: RopeCase, part: str) -> float:
    """float32: rounding order only; bf16: one unit in the last place of values up to ~16
    (fused multiply-adds on a GPU); an FP8 pool's k: one e4m3 step of values up to 32 (k / 0.5),
    where the bf16 k it quantizes is one unit off."""
    if part == "k" and case.pool_dtype == FP8_KV_DTYPE:
        return 2.0
    return 1e-5 if case.dtype == torch.float32 else 0.07
