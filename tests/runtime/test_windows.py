"""Sliding windows and logit soft-capping in the Triton kernels, and which backend computes them.

CPU: the kernels under TRITON_INTERPRET=1 (window_cases.py, in the session's interpreter
subprocess) against the torch reference with the same options. Backend selection: "triton"
computes both; "flashinfer" builds Triton's kernels for both halves for such a model, unless
`decode_kernel="flashinfer"` (then as before: soft-cap refused, windows left to the engine's
context cap); plain models build what they always did. GPU (`-m gpu`): bf16 on Gemma-like
shapes, and the windowed decode replayed from a CUDA graph for new batches.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import Case, clone_pool, compare, make_pool_and_batch
from window_cases import WINDOW_CASES, WindowCase, result_names

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention import AttentionOptions, make_attention_backend
from radixserve.runtime.attention.torch_backend import TorchAttention

FP32_TOL = 1e-4
FP16_TOL = 2e-3  # fp16 operands, fp32 accumulation
BF16_TOL = 2e-2

WINDOWED = AttentionOptions(windows=(8, None), logit_softcap=50.0)


@pytest.mark.parametrize("wc", WINDOW_CASES, ids=[wc.case.name for wc in WINDOW_CASES])
def test_triton_windows_and_softcap_match_torch(triton_cpu_results: dict, wc: WindowCase) -> None:
    """Eager and tile-table extend steps; eager, hybrid and graph-state decode steps."""
    tol = FP32_TOL if wc.case.dtype == torch.float32 else FP16_TOL
    seed = triton_cpu_results["seed"]
    for name in result_names(wc):
        got = triton_cpu_results["windows"][name]
        assert got["out"] < tol, f"{name}: rel err {got['out']:.3g} (seed {seed})"
        assert got["pool"] == 0.0, f"{name}: K/V not written at out_slots (seed {seed})"


def _pool(layers: int = 2, head_dim: int = 16) -> KVPool:
    return KVPool(KVPoolConfig(num_layers=layers, num_kv_heads=2, head_dim=head_dim, dtype=torch.float32), 8)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets the Triton backends build on the CPU (no kernel runs in this process)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.usefixtures("interpret")
def test_triton_computes_windows_and_softcap_without_cascade() -> None:
    from radixserve.runtime.attention.triton_backend import TritonAttention

    attn = make_attention_backend("triton", _pool(), 4, 2, 16, 0.25, options=WINDOWED)
    assert isinstance(attn, TritonAttention)
    assert attn.supports_windows and attn.supports_logit_softcap and not attn.supports_cascade
    plain = make_attention_backend("triton", _pool(), 4, 2, 16, 0.25)
    assert isinstance(plain, TritonAttention) and plain.supports_cascade


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize(
    "options", [WINDOWED, AttentionOptions(windows=(4, None)), AttentionOptions(logit_softcap=30.0)]
)
@pytest.mark.parametrize("decode_kernel", ["auto", "triton"])
def test_flashinfer_runs_triton_for_windowed_or_softcapped_models(
    options: AttentionOptions, decode_kernel: str
) -> None:
    from radixserve.runtime.attention.hybrid import HybridAttention
    from radixserve.runtime.attention.triton_backend import TritonAttention
    from radixserve.runtime.attention.triton_decode_backend import TritonDecodeAttention

    attn = make_attention_backend(
        "flashinfer", _pool(), 4, 2, 16, 0.25, decode_kernel=decode_kernel, options=options
    )
    assert isinstance(attn, HybridAttention) and attn.name == "triton-hybrid"
    assert isinstance(attn.extend, TritonAttention) and isinstance(attn.decode, TritonDecodeAttention)
    assert attn.supports_windows and attn.supports_logit_softcap and attn.graph_extend
    assert not attn.supports_cascade
    planner = attn.decode_graphs()
    assert planner is not None and planner.device_planned and not planner.cascade_graphs


@pytest.mark.usefixtures("interpret")
def test_flashinfer_decode_kernel_keeps_flashinfer_and_its_limits() -> None:
    """An explicit `decode_kernel="flashinfer"`: FlashInfer's kernels as before, which refuse the
    soft-cap naming the field; windows alone reach FlashInfer (here: no CUDA, so it says so); a
    head size FlashInfer is not built for is refused by name."""
    args = (_pool(head_dim=64), 4, 2, 64, 0.125)
    with pytest.raises(ValueError, match="attn_logit_softcapping=50.0"):
        make_attention_backend("flashinfer", *args, decode_kernel="flashinfer", options=WINDOWED)
    windows = AttentionOptions(windows=(8, None))
    with pytest.raises(RuntimeError, match="flashinfer"):
        make_attention_backend("flashinfer", *args, decode_kernel="flashinfer", options=windows)
    with pytest.raises(RuntimeError, match="flashinfer"):  # a plain model: FlashInfer, as always
        make_attention_backend("flashinfer", *args)
    with pytest.raises(ValueError, match="head_dim=16: the flashinfer attention backend runs head sizes 64"):
        make_attention_backend("flashinfer", _pool(), 4, 2, 16, 0.25)


def test_torch_and_auto_on_the_cpu_are_unchanged() -> None:
    for name in ("auto", "torch"):
        attn = make_attention_backend(name, _pool(), 4, 2, 16, 0.25, options=WINDOWED)
        assert isinstance(attn, TorchAttention) and attn.supports_windows and not attn.supports_cascade


def test_triton_needs_the_interpreter_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="the flashinfer attention backend needs a CUDA KV pool"):
        make_attention_backend("flashinfer", _pool(), 4, 2, 16, 0.25, options=WINDOWED)


# --- GPU ----------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Gemma 2 2B's attention: 8 query heads, 4 KV heads of 256; window 4096 in the model, a small one
# here so that long contexts cross it; soft-cap 50 as Gemma 2 (and 5, where tanh bends more).
BF16 = torch.bfloat16
GPU_WINDOW_CASES = [
    WindowCase(Case("gemma_mixed", 8, 4, 256, (300, 0, 1000), (64, 333, 1), BF16), (128, None), 50.0),
    WindowCase(Case("gemma_decode", 8, 4, 256, (2000, 17, 700), (1, 1, 1), BF16), (512, None), 5.0),
    WindowCase(Case("gqa_decode", 14, 2, 64, (3000, 5), (1, 1), BF16), (1024, 100)),
]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
@pytest.mark.parametrize("wc", GPU_WINDOW_CASES, ids=[wc.case.name for wc in GPU_WINDOW_CASES])
def test_gpu_windows_and_softcap_match_torch(backend_name: str, wc: WindowCase) -> None:
    pytest.importorskip("triton")
    case = wc.case
    pool, batch = make_pool_and_batch(case, "cuda", num_slots=8192)
    ref_pool = clone_pool(pool)
    args = (case.num_heads, case.num_kv_heads, case.head_dim, case.head_dim**-0.5)
    backend = make_attention_backend(backend_name, pool, *args, options=wc.options)
    got = compare(case, backend, ref_pool, batch, wc.options)
    assert got["out"] < BF16_TOL and got["pool"] == 0.0, got


@pytest.mark.gpu
@needs_cuda
def test_gpu_windowed_decode_graph_replays_new_batches() -> None:
    """The hybrid's Triton decode captured once (each layer's window and the soft-cap baked into
    its launches), replayed for batches whose contexts cross the window or not."""
    pytest.importorskip("triton")
    heads, kv_heads, dim, bs, layers = 8, 4, 256, 4, 2
    options = AttentionOptions(windows=(64, None), logit_softcap=20.0)
    pool = KVPool(KVPoolConfig(layers, kv_heads, dim, dtype=torch.bfloat16, device="cuda"), 8192)
    for layer in range(layers):
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    backend = make_attention_backend("flashinfer", pool, heads, kv_heads, dim, dim**-0.5, options=options)
    planner = backend.decode_graphs()
    assert planner is not None
    state = planner.make_cuda_graph_decode_state(bs, max_kv_tokens=bs * 2048)
    static_q = torch.randn(bs, heads, dim, device="cuda", dtype=torch.bfloat16)
    static_kv = torch.randn(2, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    static_slots = torch.zeros(bs, dtype=torch.int64, device="cuda")

    def make_batch(prefixes: tuple[int, ...]) -> object:
        case = Case("g", heads, kv_heads, dim, prefixes, (1,) * bs, torch.bfloat16)
        return make_pool_and_batch(case, "cuda", num_slots=8192)[1]

    warm = make_batch((10, 20, 30, 40))
    static_slots.copy_(warm.out_slots)
    warm.out_slots = static_slots
    planner.plan_cuda_graph(state, warm)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up run off the default stream, as capture requires
        for layer in range(layers):
            backend.forward(static_q, static_kv[0], static_kv[1], layer, warm)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.stack(
            [backend.forward(static_q, static_kv[0], static_kv[1], layer, warm) for layer in range(layers)]
        )

    for prefixes in ((1500, 3, 0, 777), (0, 63, 2000, 64)):
        batch = make_batch(prefixes)
        static_q.normal_()
        static_kv.normal_()
        static_slots.copy_(batch.out_slots)
        planner.plan_cuda_graph(state, batch)
        graph.replay()
        ref_pool = KVPool(KVPoolConfig(layers, kv_heads, dim, torch.float32, "cuda"), 8192)
        for layer in range(layers):
            ref_pool.k[layer].copy_(pool.k[layer])
            ref_pool.v[layer].copy_(pool.v[layer])
        ref = TorchAttention(ref_pool, heads, kv_heads, dim, dim**-0.5, options=options)
        ref.plan(batch)
        for layer in range(layers):
            # The graph already wrote this step's K/V; the reference writes the same values again.
            expect = ref.forward(static_q.float(), static_kv[0].float(), static_kv[1].float(), layer, batch)
            err = float((static_out[layer].double() - expect.double()).norm() / expect.double().norm())
            assert err < BF16_TOL, (prefixes, layer, err)
