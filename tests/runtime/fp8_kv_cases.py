"""Shared cases for FP8 KV cache attention: a backend over an FP8 pool against the float32
torch reference over the same K/V fake-quantized (quantized and read back, cache/kv_quant.py).

Scales differ per layer and from 1.0, so a kernel that drops or swaps a scale, or applies one
twice, is off by far more than the tolerance. Used on the CPU (torch backend in process,
Triton under the interpreter: interpreted_cases.py) and on the GPU (test_fp8_kv_gpu.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from attention_cases import CASCADE_CASES, CPU_CASES, Case, make_pool_and_batch, rel_err, shared_batch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.cache.kv_quant import FP8_KV_DTYPE, dequantize, fake_quantize, quantize
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.forward_batch import ForwardBatch

K_SCALES = (0.05, 0.5)  # per layer: K values of about 3 fill e4m3's range at 0.05 (|k / s| <= ~300)
V_SCALES = (2.0, 0.3)
SPREAD = 3.0  # K/V magnitude: randn * SPREAD

# Mixed prefill + decode, a split decode, float16 queries, and one cascade layout (by name).
FP8_CASES = [CPU_CASES[0], CPU_CASES[4], CPU_CASES[6]]
FP8_CASCADE = "two_groups_and_singletons"

MakeBackend = Callable[[KVPool, Case], AttentionBackend]


def fp8_pools(pool: KVPool, case: Case) -> tuple[KVPool, KVPool]:
    """An FP8 pool holding `pool`'s random K/V (times SPREAD) quantized with the case scales,
    and the float32 reference pool holding exactly what it reads back."""
    c = pool.config
    scales = (K_SCALES[: c.num_layers], V_SCALES[: c.num_layers])
    fcfg = replace(c, dtype=FP8_KV_DTYPE, compute_dtype=case.dtype, k_scales=scales[0], v_scales=scales[1])
    fp8 = KVPool(fcfg, pool.num_slots)
    ref = KVPool(
        KVPoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, torch.float32, c.device), pool.num_slots
    )
    for layer in range(c.num_layers):
        for src, dst, rdst, s in (
            (pool.k, fp8.k, ref.k, fcfg.k_scale(layer)),
            (pool.v, fp8.v, ref.v, fcfg.v_scale(layer)),
        ):
            dst[layer].copy_(quantize(src[layer].float() * SPREAD, s))
            rdst[layer].copy_(dequantize(dst[layer], s, torch.float32))
    return fp8, ref


def compare_fp8(
    case: Case, backend: AttentionBackend, ref_pool: KVPool, batch: ForwardBatch
) -> dict[str, float]:
    """Every layer through `backend` (over its FP8 pool) and the float32 torch reference over
    `ref_pool` (the same K/V dequantized) with the step's new K/V fake-quantized. Returns the
    worst output error and the worst error of the pool read back (0.0: stored as `quantize`)."""
    c = backend.pool.config
    scale = case.head_dim**-0.5
    ref = TorchAttention(ref_pool, case.num_heads, case.num_kv_heads, case.head_dim, scale)
    backend.plan(batch)
    ref.plan(batch)
    device = batch.kv_indices.device
    worst = {"out": 0.0, "pool": 0.0}
    n = batch.num_tokens
    for layer in range(case.num_layers):
        ks, vs = c.k_scale(layer), c.v_scale(layer)
        q = torch.randn(n, case.num_heads, case.head_dim, device=device).to(case.dtype)
        k = (torch.randn(n, case.num_kv_heads, case.head_dim, device=device) * SPREAD).to(case.dtype)
        v = (torch.randn(n, case.num_kv_heads, case.head_dim, device=device) * SPREAD).to(case.dtype)
        out = backend.forward(q, k, v, layer, batch)
        expect = ref.forward(
            q.float(), fake_quantize(k.float(), ks), fake_quantize(v.float(), vs), layer, batch
        )
        assert out.shape == q.shape and out.dtype == q.dtype
        worst["out"] = max(worst["out"], rel_err(out, expect))
        got_k = dequantize(backend.pool.k[layer], ks, torch.float32)
        got_v = dequantize(backend.pool.v[layer], vs, torch.float32)
        pool_err = max(rel_err(got_k, ref_pool.k[layer]), rel_err(got_v, ref_pool.v[layer]))
        worst["pool"] = max(worst["pool"], pool_err)
    return worst


def run_fp8_cases(
    make: MakeBackend, device: str, cases: list[Case] = FP8_CASES
) -> dict[str, dict[str, float]]:
    """Each case (and the cascade layout) through `make(fp8_pool, case)`'s backend."""
    results: dict[str, dict[str, float]] = {}
    for case in cases:
        pool, batch = make_pool_and_batch(case, device)
        fp8, ref = fp8_pools(pool, case)
        results[case.name] = compare_fp8(case, make(fp8, case), ref, batch)
    groups, suffix, (hq, hkv), d = CASCADE_CASES[FP8_CASCADE]
    fb, slots = shared_batch(groups, suffix, device)
    dtype = cases[-1].dtype  # the last case's: float16 here, bfloat16 on the GPU
    case = Case(FP8_CASCADE, hq, hkv, d, tuple(fb.prefix_lens), tuple(fb.extend_lens), dtype=dtype)
    pool = KVPool(KVPoolConfig(case.num_layers, hkv, d, dtype=torch.float32, device=device), slots)
    for layer in range(case.num_layers):
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    fp8, ref = fp8_pools(pool, case)
    backend = make(fp8, case)
    assert backend.supports_cascade, backend.name
    results["cascade"] = compare_fp8(case, backend, ref, fb)
    return results


def run_triton_fp8_cases() -> dict[str, dict[str, float]]:
    """The Triton backend over FP8 pools under the interpreter (its K/V store kernel included)."""
    from radixserve.runtime.attention import make_attention_backend

    def make(pool: KVPool, case: Case) -> AttentionBackend:
        d = case.head_dim
        backend = make_attention_backend("triton", pool, case.num_heads, case.num_kv_heads, d, d**-0.5)
        backend.decode_splits = case.decode_splits  # type: ignore[attr-defined]
        return backend

    return run_fp8_cases(make, "cpu")


def run_triton_f16_tile_cases() -> dict[str, float]:
    """The decode kernel with bfloat16 queries over an FP8 pool, its tiles upcast to float16
    (`DecodeTiling.fp8_f16`), whole and in 3 splits, against the float32 reference
    over the dequantized pool; "huge": one query element beyond float16's range, clamped to it
    (its row's attention saturates instead of turning NaN)."""
    from radixserve.runtime.attention import triton_kernels as tk
    from radixserve.runtime.attention.base import LayerOptions

    hq, hkv, d, n, lens = 8, 2, 64, 200, (40, 7, 77)
    k, v = (torch.randn(n, hkv, d) * SPREAD for _ in range(2))
    ks, vs = K_SCALES[0], V_SCALES[0]
    k8, v8 = quantize(k, ks), quantize(v, vs)
    kf, vf = dequantize(k8, ks, torch.float32), dequantize(v8, vs, torch.float32)
    slots = torch.randperm(n)[: sum(lens)].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(len(lens), hq, d).to(torch.bfloat16)
    results: dict[str, float] = {}
    for name, query in (
        ("whole", q),
        ("huge", q.clone().index_put_((torch.tensor(1), torch.tensor(0)), q[1, 0] * 1e6)),
    ):
        expect = []
        for b in range(len(lens)):
            rows = slots[indptr[b] : indptr[b + 1]].long()
            kb, vb = (t[rows].repeat_interleave(hq // hkv, dim=1) for t in (kf, vf))
            qb = query[b].float().clamp(-65504.0, 65504.0)
            expect.append(
                torch.einsum("hn,nhd->hd", (torch.einsum("hd,nhd->hn", qb, kb) * d**-0.5).softmax(-1), vb)
            )
        for splits in (1, 3):
            tiling = tk.DecodeTiling(splits, 16)
            assert tiling.fp8_f16  # the engine's default
            out = tk.decode_attention(
                query, (k8, v8), (indptr, slots), d**-0.5, tiling, opts=LayerOptions(kv_scales=(ks, vs))
            )
            results[f"{name} {splits}"] = (
                rel_err(out, torch.stack(expect)) if out.isfinite().all() else float("inf")
            )
    return results
