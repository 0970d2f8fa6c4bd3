"""Layer kernels (runtime/kernels.py): the choice, and FlashInfer's ops against the reference.

The reference (`TorchKernels`) is what every CPU test runs, so greedy equality
with transformers covers it. On the GPU (`-m gpu`) each FlashInfer op is
compared with the reference computed in float32 from the same bf16 inputs:
the fused ops round once, the reference several times, so the bound is a few
bf16 ulps. End to end, the GPU suite's correctness section (top-1 agreement
with float32 transformers) runs the engine with the default, FlashInfer's.
"""

from __future__ import annotations

import pytest
import torch

from radixserve import EngineConfig
from radixserve.runtime.kernels import TORCH_KERNELS, make_kernels


def test_auto_is_the_reference_on_the_cpu() -> None:
    assert make_kernels("auto", torch.device("cpu"), torch.float32) is TORCH_KERNELS
    assert make_kernels("auto", torch.device("cpu"), torch.bfloat16) is TORCH_KERNELS
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        make_kernels("flashinfer", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="unknown layer kernels"):
        make_kernels("fused", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="layer_kernels"):
        EngineConfig(layer_kernels="fast")


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_flashinfer_kernels_match_the_reference() -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    fk = make_kernels("flashinfer", dev, dt)
    assert fk.name == "flashinfer"
    g = torch.Generator(device=dev).manual_seed(0)
    t, hidden, hq, hkv, d = 37, 896, 14, 2, 64
    x = torch.randn(t, hidden, device=dev, dtype=dt, generator=g)
    res = torch.randn(t, hidden, device=dev, dtype=dt, generator=g)
    w = torch.rand(hidden, device=dev, dtype=dt, generator=g) + 0.5
    ref32 = TORCH_KERNELS.rms_norm(x.float(), w.float(), 1e-6)
    _close(fk.rms_norm(x, w, 1e-6), ref32)
    want_n, want_r = TORCH_KERNELS.add_rms_norm(x.float(), res.float(), w.float(), 1e-6)
    got_n, got_r = fk.add_rms_norm(x.clone(), res.clone(), w, 1e-6)
    _close(got_r, want_r)
    _close(got_n, want_n)
    gu = torch.randn(t, 2 * 4864, device=dev, dtype=dt, generator=g)
    _close(fk.silu_and_mul(gu), TORCH_KERNELS.silu_and_mul(gu.float()))
    # Rotary on strided views of a fused qkv output, as the model calls it.
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=dev, dtype=dt, generator=g)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.unflatten(-1, (hq, d)), k.unflatten(-1, (hkv, d))
    pos = torch.randint(0, 4000, (t,), device=dev, generator=g)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    freqs = torch.arange(4096, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    want_q, want_k = TORCH_KERNELS.rope(pos, q.float(), k.float(), cos, sin)
    got_q, got_k = fk.rope(pos, q, k, cos, sin)
    _close(got_q, want_q)
    _close(got_k, want_k)
    # No rows (a prefill chunk that ends mid-prompt samples nothing): empty results, no launch.
    assert fk.rms_norm(x[:0], w, 1e-6).shape == (0, hidden)
    assert fk.add_rms_norm(x[:0], res[:0], w, 1e-6)[0].shape == (0, hidden)
    assert fk.silu_and_mul(gu[:0]).shape == (0, 4864)
    assert fk.rope(pos[:0], q[:0], k[:0], cos, sin)[0].shape == (0, hq, d)


def test_plan_max_shadow_gives_builtin_results() -> None:
    import types

    from radixserve.runtime.attention.flashinfer_plan_max import speed_up_plans

    fake = types.SimpleNamespace(prefill=types.ModuleType("prefill"), decode=types.ModuleType("decode"))
    speed_up_plans(fake)
    fast = fake.prefill.max
    lens = torch.tensor([3, 9, 4], dtype=torch.int32)
    assert fast(lens).dim() == 0 and fast(lens).item() == max(lens).item() == 9
    assert fast([1, 5, 2]) == 5 and fast(4, 6) == 6 and fast([], default=0) == 0
    with pytest.raises(ValueError):
        fast(torch.tensor([], dtype=torch.int32))
