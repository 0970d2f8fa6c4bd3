"""The CUDA FP8 GEMM (`torch._scaled_mm`, runtime/fp8_linear.py) against the CPU reference,
under CUDA graphs, and a tiny FP8 model through the engine with and without graphs
(GPU only, compute capability >= 8.9; the CPU side is tests/model/test_fp8*.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from radixserve.model.layers import Linear
from radixserve.model.loader import load_model
from radixserve.runtime.fp8_linear import MIN_CAPABILITY, reference_linear, scaled_mm_linear

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY,
        reason="needs a CUDA device of compute capability >= 8.9",
    ),
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("m", (1, 3, 17, 128, 1000))
@pytest.mark.parametrize(("k", "n"), [(256, 512), (2048, 384)])
@pytest.mark.parametrize("bias", (False, True))
def test_scaled_mm_matches_the_reference(m: int, k: int, n: int, bias: bool) -> None:
    """Same quantized operands on both sides: they differ by accumulation order and the
    bfloat16 rounding of the output (about 2^-9 relative), nothing of FP8's own error."""
    gen = torch.Generator(device="cuda").manual_seed(m * k + n)
    layer = Linear(k, n, bias=bias, dtype=torch.bfloat16).cuda()
    with torch.no_grad():
        layer.weight.normal_(0, 0.05, generator=gen)
        if layer.bias is not None:
            layer.bias.normal_(0, 0.5, generator=gen)
    layer.quantize_fp8_()
    assert layer.weight_scale is not None
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 3
    got = scaled_mm_linear(x, layer.weight, layer.weight_scale, layer.bias)
    cpu_bias = None if layer.bias is None else layer.bias.cpu()
    want = reference_linear(x.cpu(), layer.weight.cpu(), layer.weight_scale.cpu(), cpu_bias)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert _rel(got.cpu(), want) < 1e-2
    assert torch.equal(layer(x), got)  # Linear's forward takes this path on CUDA


def test_fp8_linear_replays_in_a_cuda_graph() -> None:
    layer = Linear(512, 256, bias=True, dtype=torch.bfloat16).cuda()
    with torch.no_grad():
        layer.weight.normal_(0, 0.05)
        layer.bias.normal_()  # type: ignore[union-attr]
    layer.quantize_fp8_()
    static_x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(static_x)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in range(3):
        x = torch.randn(
            8, 512, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(seed)
        )
        static_x.copy_(x)
        graph.replay()
        assert torch.equal(static_y, layer(x))


def _greedy(folder: Path, prompts: list[list[int]], cuda_graph: bool) -> list[list[int]]:
    from radixserve import AsyncEngine, EngineConfig, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    config = EngineConfig(
        model=str(folder), device="cuda", dtype="bfloat16", quantization="fp8", cuda_graph=cuda_graph
    )

    async def main() -> list[list[int]]:
        async with AsyncEngine(config) as engine:
            outs = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
            return [list(o.token_ids) for o in outs]

    return asyncio.run(main())


def _tiny_llama(folder: Path) -> None:
    """A random tiny Llama saved by transformers (every linear dim a multiple of 16)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
            else:  # norm weights around one
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(folder)


def test_tiny_fp8_model_under_cuda_graphs(tmp_path: Path) -> None:
    """Graph replays run the same kernels as eager steps: the same greedy tokens."""
    _tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path), dtype=torch.bfloat16, device="cuda", quantization="fp8")
    assert loaded.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    prompts = [
        torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (5, 12, 23, 40)
    ]
    graphed = _greedy(tmp_path, prompts, cuda_graph=True)
    assert graphed == _greedy(tmp_path, prompts, cuda_graph=False)
    assert all(len(t) == 24 for t in graphed)


def test_dummy_shape_quantizes_at_load() -> None:
    """A real shape's linears (every dim a multiple of 16) quantize and run."""
    loaded = load_model("dummy:qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda", quantization="fp8")
    fp8 = [n for n, p in loaded.model.named_parameters() if p.dtype == torch.float8_e4m3fn]
    assert len(fp8) == 4 * loaded.config.num_layers
