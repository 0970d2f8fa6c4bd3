"""The FP8 KV cache (`kv_cache_dtype="fp8_e4m3"`) at the backend level, on the CPU: the torch
backend and the interpreted Triton kernels (K/V store included) over an FP8 pool against the
float32 reference over fake-quantized K/V (fp8_kv_cases.py), and the pool's own rules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.cache.kv_quant import FP8_KV_DTYPE, dequantize, fake_quantize, quantize
from radixserve.runtime.attention.torch_backend import TorchAttention

sys.path.insert(0, str(Path(__file__).parent))
from attention_cases import Case  # noqa: E402
from fp8_kv_cases import FP8_CASES, run_fp8_cases  # noqa: E402

FP32_TOL = 1e-4
FP16_TOL = 2e-3
NAMES = [c.name for c in FP8_CASES] + ["cascade"]


def _tol(name: str) -> float:
    dtypes = {c.name: c.dtype for c in FP8_CASES}
    return FP32_TOL if dtypes.get(name, torch.float16) == torch.float32 else FP16_TOL


def _fp8_config(**kw: object) -> KVPoolConfig:
    base: dict[str, object] = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": FP8_KV_DTYPE}
    return KVPoolConfig(**{**base, "compute_dtype": torch.float32, **kw})  # type: ignore[arg-type]


def test_quantize_saturates_and_rounds_like_the_cast() -> None:
    x = torch.tensor([1000.0, -1000.0, 7.9, 0.3, -0.0])
    q = quantize(x, 2.0)
    assert q.dtype == FP8_KV_DTYPE
    assert dequantize(q, 2.0, torch.float32).tolist() == [896.0, -896.0, 8.0, 0.3125, 0.0]
    y = torch.randn(1000) * 10
    assert torch.equal(fake_quantize(y, 1.0), y.to(FP8_KV_DTYPE).float())


def test_fp8_pool_write_stores_quantized_rows() -> None:
    pool = KVPool(_fp8_config(k_scales=(0.5, 4.0), v_scales=(1.0, 0.25)), 10)
    k, v = torch.randn(3, 2, 8) * 5, torch.randn(3, 2, 8)
    slots = torch.tensor([7, 2, 5])
    pool.write(1, slots, k, v)
    assert torch.equal(pool.k[1][slots].view(torch.uint8), quantize(k, 4.0).view(torch.uint8))
    assert torch.equal(pool.v[1][slots].view(torch.uint8), quantize(v, 0.25).view(torch.uint8))
    assert pool.nbytes == 10 * 2 * 2 * 2 * 8  # one byte per element


def test_fp8_pool_config_rules() -> None:
    with pytest.raises(ValueError, match="compute_dtype"):
        KVPoolConfig(2, 2, 8, dtype=FP8_KV_DTYPE)
    with pytest.raises(ValueError, match="k_scales"):
        _fp8_config(k_scales=(1.0,))
    with pytest.raises(ValueError, match="v_scales"):
        _fp8_config(v_scales=(1.0, 0.0))
    with pytest.raises(ValueError, match="unquantized"):
        KVPoolConfig(2, 2, 8, k_scales=(1.0, 1.0))
    c = _fp8_config()
    assert c.fp8 and c.attn_dtype == torch.float32 and c.k_scale(1) == 1.0 == c.v_scale(0)
    assert 2 * c.bytes_per_slot == KVPoolConfig(2, 2, 8, dtype=torch.bfloat16).bytes_per_slot


@pytest.fixture(scope="module")
def torch_results() -> dict[str, dict[str, float]]:
    torch.manual_seed(0)

    def make(pool: KVPool, case: Case) -> TorchAttention:
        d = case.head_dim
        return TorchAttention(pool, case.num_heads, case.num_kv_heads, d, d**-0.5)

    return run_fp8_cases(make, "cpu")


@pytest.mark.parametrize("name", NAMES)
def test_torch_backend_fp8_matches_fake_quantized_reference(
    torch_results: dict[str, dict[str, float]], name: str
) -> None:
    got = torch_results[name]
    assert got["out"] < _tol(name), (name, got)
    assert got["pool"] == 0.0, (name, got)


@pytest.mark.parametrize("name", NAMES)
def test_triton_fp8_interpreted_matches_fake_quantized_reference(triton_cpu_results: dict, name: str) -> None:
    """Decode, split decode, extend (mixed) and cascade kernels; `pool` 0.0: the store kernel
    writes exactly `quantize`'s bytes (`_round_e4m3`)."""
    got = triton_cpu_results["fp8_kv"][name]
    assert got["out"] < _tol(name), (name, got, triton_cpu_results["seed"])
    assert got["pool"] == 0.0, (name, got, triton_cpu_results["seed"])


def test_triton_fp8_decode_upcasts_bf16_queries_to_float16(triton_cpu_results: dict) -> None:
    """bfloat16 queries over an FP8 pool: float16 tiles (one conversion per pair of elements
    on the GPU), within bfloat16's error of the reference, a query beyond float16's range
    included (clamped, not inf or NaN)."""
    got = triton_cpu_results["fp8_f16_tiles"]
    assert set(got) == {"whole 1", "whole 3", "huge 1", "huge 3"}
    assert all(err < 1.5e-2 for err in got.values()), (got, triton_cpu_results["seed"])
