"""FP8 KV cache arithmetic: what the pool stores and what attention reads back.

An FP8 pool (`EngineConfig.kv_cache_dtype="fp8_e4m3"`) keeps K and V in float8_e4m3fn with
one float scale per layer for K and one for V (1.0 unless the checkpoint carries calibrated
`k_scale` / `v_scale`): stored `fp8(clamp(x / scale, -448, 448))`, read `float(x_fp8) * scale`.
The clamp saturates instead of overflowing to NaN (e4m3fn has no infinity). These two
functions are the reference every backend and kernel is tested against (docs/fp8.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# EngineConfig.kv_cache_dtype -> the pool's storage dtype ("auto": the model's).
KV_CACHE_DTYPES = {"fp8_e4m3": FP8_KV_DTYPE}


@dataclass(frozen=True)
class KVScales:
    """A checkpoint's calibrated per-layer K and V scales (its `k_scale` / `v_scale`)."""

    k: tuple[float, ...]
    v: tuple[float, ...]


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """`x / scale` saturated to e4m3fn's range, rounded to nearest even (torch's cast)."""
    y = x.float() if scale == 1.0 else x.float() / scale
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored FP8 back to `dtype`: the upcast (exact) times the scale."""
    y = x.to(dtype)
    return y if scale == 1.0 else y * scale


def fake_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """`x` as an FP8 pool returns it: quantized and read back in `x`'s dtype."""
    return dequantize(quantize(x, scale), scale, x.dtype)
