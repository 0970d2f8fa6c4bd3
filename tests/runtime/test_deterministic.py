"""The deterministic mode's kernels on the CPU: the tiled linear and the invariant torch
attention give a row the same bits whatever the batch, chunking or decode around it; the
Triton ones the same under the interpreter (deterministic_cases.py, interpreted_cases.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from deterministic_cases import HKV, HQ, D, invariance_case, option_cases

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.attention.base import AttentionBackend, AttentionOptions
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.attention.torch_invariant import InvariantTorchAttention
from radixserve.runtime.matmul import TiledMatmul


def _invariant(pool: KVPool, options: AttentionOptions) -> AttentionBackend:
    return make_attention_backend("auto", pool, HQ, HKV, D, D**-0.5, options=options, deterministic=True)


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (64, 1000)])
@pytest.mark.parametrize("bias", [False, True])
def test_tiled_linear_row_is_the_same_in_any_batch_and_close_to_torch(
    shape: tuple[int, int], bias: bool
) -> None:
    torch.manual_seed(0)
    k, n = shape
    w, b, x = torch.randn(n, k) * 0.05, torch.randn(n) if bias else None, torch.randn(100, k)
    mm = TiledMatmul()
    alone = mm.linear(x[37:38], w, b)
    for m in (1, 7, 16, 17, 64, 100):
        lo = max(0, 38 - m)
        y = mm.linear(x[lo : lo + m], w, b)
        if lo <= 37 < lo + m:
            assert torch.equal(y[37 - lo], alone[0]), m
        torch.testing.assert_close(y, F.linear(x[lo : lo + m], w, b), rtol=1e-5, atol=1e-5)
    assert mm.linear(x[:0], w, b).shape == (0, n)
    assert mm.linear(x[:6].view(2, 3, k), w, b).shape == (2, 3, n)


@pytest.mark.parametrize("name", list(option_cases()))
def test_invariant_torch_attention_gives_each_token_the_same_bits_prefilled_chunked_or_decoded(
    name: str,
) -> None:
    res = invariance_case(_invariant, option_cases()[name])
    assert res["chunked_vs_whole"] == 0.0, res
    assert res["decoded_vs_whole"] == 0.0, res
    assert res["rel_err_vs_reference"] < 1e-5, res


def test_the_default_torch_attention_moves_with_chunking_and_batching() -> None:
    """Why the mode exists: SDPA on the CPU sums a token's keys differently in a chunk,
    in a whole prefill and in a padded decode batch (last-bit differences, measured)."""

    def plain(pool: KVPool, options: AttentionOptions) -> AttentionBackend:
        return TorchAttention(pool, HQ, HKV, D, D**-0.5, options)

    res = invariance_case(plain, AttentionOptions())
    assert res["decoded_vs_whole"] > 0.0, res


def test_deterministic_auto_backend_on_the_cpu_is_the_invariant_torch_one() -> None:
    from radixserve.cache.kv_pool import KVPoolConfig

    pool = KVPool(KVPoolConfig(1, HKV, D, dtype=torch.float32, device="cpu"), 8)
    assert isinstance(_invariant(pool, AttentionOptions()), InvariantTorchAttention)
    with pytest.raises(ValueError, match="no FlashInfer"):
        make_attention_backend("flashinfer", pool, HQ, HKV, D, 1.0, deterministic=True)


@pytest.mark.parametrize("name", list(option_cases()))
def test_invariant_triton_attention_under_the_interpreter(triton_cpu_results: dict, name: str) -> None:
    """Prefilled, chunked, decoded eagerly and decoded through a (padded) graph state: the same
    bits for every token."""
    res = triton_cpu_results["invariance"][name]
    assert res["chunked_vs_whole"] == 0.0, res
    assert res["decoded_vs_whole"] == 0.0, res
    assert res["graph_decoded_vs_whole"] == 0.0, res
    assert res["rel_err_vs_reference"] < 1e-5, res


def test_invariant_triton_linear_under_the_interpreter(triton_cpu_results: dict) -> None:
    res = triton_cpu_results["invariant_matmul"]
    assert res["row_vs_alone"] == 0.0, res
    assert res["vs_torch"] < 1e-5, res
