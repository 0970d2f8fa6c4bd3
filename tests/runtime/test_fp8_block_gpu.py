"""The CUDA block-scaled FP8 GEMM (`torch.nn.functional.scaled_mm` with 1 x 128 activation and
128 x 128 weight scales, runtime/fp8_block.py) against the CPU reference, under CUDA graphs, and a
tiny block-FP8 checkpoint through the engine (GPU only, Hopper; the CPU side is
tests/model/test_fp8_block.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.model.layers import Linear
from radixserve.model.loader import load_model
from radixserve.runtime.fp8_block import GPU_BLOCK, block_scaled_mm_linear, reference_block_linear
from tests.model.test_fp8_block import quantize_blocks, to_block_fp8
from tests.runtime.test_fp8_gpu import (
    MOST,
    NEAR_TIE,
    assert_replays_in_a_cuda_graph,
    eager_gaps,
    graphed_greedy,
    tiny_llama,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
        reason="needs a Hopper GPU (compute capability 9.x)",
    ),
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _block_linear(k: int, n: int, bias: bool, seed: int) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, n, bias=bias, dtype=torch.bfloat16)
    layer.to_fp8(GPU_BLOCK)
    w8, scale = quantize_blocks(torch.randn(n, k, generator=gen) * 0.05, GPU_BLOCK)
    assert layer.weight_scale is not None
    with torch.no_grad():
        layer.weight.copy_(w8)
        layer.weight_scale.copy_(layer.checkpoint_scale(scale))
        if layer.bias is not None:
            layer.bias.normal_(0, 0.5, generator=gen)
    return layer.cuda()


@pytest.mark.parametrize("m", (1, 3, 4, 17, 256))
@pytest.mark.parametrize(("k", "n"), [(256, 384), (640, 256)])
@pytest.mark.parametrize("bias", (False, True))
def test_block_scaled_mm_matches_the_reference(m: int, k: int, n: int, bias: bool) -> None:
    """Same quantized operands on both sides (the groups' quantizer is the same torch code):
    they differ by accumulation order and the bfloat16 output's rounding. 640 columns are 5
    K blocks, whose scales cuBLAS reads padded to 8."""
    layer = _block_linear(k, n, bias, seed=m * k + n)
    assert layer.weight_scale is not None and layer.weight_block == GPU_BLOCK
    x = torch.randn(
        m, k, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(m)
    )
    got = block_scaled_mm_linear(x, layer.weight, layer.weight_scale, layer.bias)
    cpu_bias = None if layer.bias is None else layer.bias.cpu()
    want = reference_block_linear(x.cpu(), layer.weight.cpu(), layer.weight_scale.cpu(), GPU_BLOCK, cpu_bias)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert _rel(got.cpu(), want) < 1e-2
    assert torch.equal(layer(x), got)  # Linear's forward takes this path on CUDA


def test_block_fp8_linear_replays_in_a_cuda_graph() -> None:
    assert_replays_in_a_cuda_graph(_block_linear(512, 256, bias=True, seed=1), 6, 512)  # 6 rows: padded to 8


def test_block_fp8_checkpoint_greedy_under_cuda_graphs(tmp_path: Path) -> None:
    """A fine-grained FP8 checkpoint (128 x 128 blocks) loads on the GPU and its graphed greedy
    tokens are the eager engine's top-1 or within `NEAR_TIE` of it (as test_fp8_gpu's check)."""
    # Every linear dim whole 128 x 128 blocks: q 256, k/v 128 (heads of 128), gate/up 512.
    tiny_llama(tmp_path / "src", hidden=256, intermediate=512, heads=2, kv_heads=1)
    to_block_fp8(tmp_path / "src", tmp_path / "fp8", GPU_BLOCK)
    folder = tmp_path / "fp8"
    loaded = load_model(str(folder), dtype=torch.bfloat16, device="cuda")
    assert loaded.model.model.layers[0].mlp.down_proj.weight_block == GPU_BLOCK
    prompts = [
        torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (5, 12, 23, 40)
    ]
    graphed, eager_draws = graphed_greedy(folder, prompts, None)
    assert all(len(t) == 24 for t in graphed)
    assert eager_draws <= 8
    gaps = [g for row in eager_gaps(folder, prompts, graphed, None) for g in row]
    assert max(gaps) <= NEAR_TIE, gaps
    assert sum(g == 0.0 for g in gaps) >= MOST * len(gaps), gaps
