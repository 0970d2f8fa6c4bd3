"""The FP8 KV cache on the GPU (compute capability >= 8.9): FlashInfer's and the Triton
backends over FP8 pools against the float32 torch reference on fake-quantized K/V
(fp8_kv_cases.py: decode, split decode, mixed extend, cascade), in bfloat16; and an engine
with an FP8 cache under CUDA graphs giving the tokens it gives eagerly."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.fp8_linear import MIN_CAPABILITY

sys.path.insert(0, str(Path(__file__).parent))
from attention_cases import Case  # noqa: E402
from fp8_kv_cases import FP8_CASES, run_fp8_cases  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY,
        reason="needs a CUDA device of compute capability >= 8.9",
    ),
]

BF16_TOL = 1.5e-2  # bf16 queries and outputs against a float32 reference
GPU_CASES = [replace(c, dtype=torch.bfloat16) for c in FP8_CASES]
BACKENDS = [("triton", "auto"), ("flashinfer", "triton"), ("flashinfer", "flashinfer")]


def _maker(name: str, decode_kernel: str):  # type: ignore[no-untyped-def]
    def make(pool: KVPool, case: Case) -> AttentionBackend:
        d = case.head_dim
        return make_attention_backend(
            name, pool, case.num_heads, case.num_kv_heads, d, d**-0.5, decode_kernel=decode_kernel
        )

    return make


@pytest.mark.parametrize(("name", "decode_kernel"), BACKENDS)
def test_fp8_kv_backend_matches_fake_quantized_reference(name: str, decode_kernel: str) -> None:
    if name == "flashinfer":
        pytest.importorskip("flashinfer")
    torch.manual_seed(0)
    results = run_fp8_cases(_maker(name, decode_kernel), "cuda", GPU_CASES)
    for case_name, got in results.items():
        assert got["out"] < BF16_TOL, (name, decode_kernel, case_name, got)
        assert got["pool"] == 0.0, (name, decode_kernel, case_name, got)


# Where the eager engine's first token leads the runner-up by less than this (nats), the two
# paths may pick either: FP8 K/V rounding moves a random-weight model's logits by ~1e-2.
CLEAR_MARGIN = 0.05


@pytest.mark.parametrize("attention_backend", ["triton", "flashinfer"])
def test_fp8_kv_engine_runs_under_cuda_graphs(attention_backend: str) -> None:
    """Decode and extend graphs captured over an FP8 pool: every request completes and the
    tree stays consistent; each prompt's first token (its prefill's argmax) equals the eager
    engine's wherever the eager top-1 is clear of the runner-up (`CLEAR_MARGIN`: the graphs'
    prefill may run another kernel over the same FP8 K/V). Later tokens of a random-weight
    model sit on near-ties, so they are not compared."""
    if attention_backend == "flashinfer":
        pytest.importorskip("flashinfer")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=True, top_logprobs=2)
    prompts = [[1, 2, 3, 4, 5] * k for k in (1, 3, 7, 20)]

    async def run(cuda_graph: bool) -> list[tuple[list[int], float]]:
        cfg = EngineConfig(
            model="dummy:smollm2-135m",
            device="cuda",
            kv_cache_dtype="fp8_e4m3",
            attention_backend=attention_backend,
            cuda_graph=cuda_graph,
            kv_cache_tokens=8192,
        )
        async with AsyncEngine(cfg) as engine:
            assert engine.pool is not None and engine.pool.config.fp8
            outs = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
            await engine.check_integrity()
        top = [o.logprobs[0].top for o in outs]
        return [(list(o.token_ids), t[0][1] - t[1][1]) for o, t in zip(outs, top)]

    graphs, eager = asyncio.run(run(True)), asyncio.run(run(False))
    assert all(len(t) == params.max_tokens for t, _ in graphs + eager)
    firsts = [(g[0][0], e[0][0], round(e[1], 4)) for g, e in zip(graphs, eager)]
    assert any(margin > CLEAR_MARGIN for _, _, margin in firsts), firsts  # something compared
    assert all(g == e for g, e, margin in firsts if margin > CLEAR_MARGIN), firsts
