"""Attention backends against the torch reference, and backend selection.

CPU: the Triton kernels under TRITON_INTERPRET=1 in a subprocess (the flag
must be set before triton defines the kernels and must not leak into this
process), float32 and float16. GPU (`-m gpu`, the device machine): Triton and
FlashInfer in bfloat16 on model-like shapes, and FlashInfer's CUDA-graph
decode path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention import BACKEND_NAMES, TorchAttention, make_attention_backend
from radixserve.runtime.forward_batch import ForwardBatch

sys.path.insert(0, str(Path(__file__).parent))
from attention_cases import (  # noqa: E402
    CASCADE_CASES,
    CPU_CASES,
    Case,
    clone_pool,
    compare,
    make_pool_and_batch,
    shared_batch,
)

HERE = Path(__file__).parent
FP32_TOL = 1e-4
FP16_TOL = 2e-3  # fp16 operands, fp32 accumulation
BF16_TOL = 1.5e-2  # bf16 operands (and bf16 pool) against a float32 reference


def _cpu_pool() -> KVPool:
    return KVPool(KVPoolConfig(num_layers=1, num_kv_heads=2, head_dim=64), num_slots=16)


# --- selection ---------------------------------------------------------------


def test_unknown_name_lists_choices() -> None:
    with pytest.raises(ValueError) as e:
        make_attention_backend("sdpa", _cpu_pool(), 4, 2, 64, 0.125)
    for name in BACKEND_NAMES:
        assert name in str(e.value)


def test_auto_on_cpu_is_torch() -> None:
    backend = make_attention_backend("auto", _cpu_pool(), 4, 2, 64, 0.125)
    assert isinstance(backend, TorchAttention)


def test_torch_by_name() -> None:
    assert make_attention_backend("torch", _cpu_pool(), 4, 2, 64, 0.125).name == "torch"


def test_flashinfer_on_cpu_pool_is_a_clear_error() -> None:
    # Either flashinfer is missing (install hint) or the pool is not on CUDA.
    with pytest.raises(RuntimeError, match="flashinfer"):
        make_attention_backend("flashinfer", _cpu_pool(), 4, 2, 64, 0.125)


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="triton"):
        make_attention_backend("triton", _cpu_pool(), 4, 2, 64, 0.125)


def test_import_radixserve_does_not_import_gpu_libraries() -> None:
    code = (
        "import sys, radixserve, radixserve.runtime.attention; "
        "bad = [m for m in ('triton', 'flashinfer') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- torch backend: a mixed step's decode rows in one batched call -------------


MIXED_CASES = [CPU_CASES[0], Case("mixed_mha_3dec", 4, 4, 32, (5, 0, 30, 12), (1, 9, 1, 1))]


@pytest.mark.parametrize("case", MIXED_CASES, ids=[c.name for c in MIXED_CASES])
def test_torch_mixed_step_equals_each_request_alone(case: Case) -> None:
    """Decode rows beside prefill rows take the batched decode call; each request's
    output equals the same request run alone (one SDPA call of its own)."""
    pool, batch = make_pool_and_batch(case, "cpu")
    scale = case.head_dim**-0.5
    attn = TorchAttention(pool, case.num_heads, case.num_kv_heads, case.head_dim, scale)
    attn.plan(batch)
    assert attn._decode is not None and attn._decode[0] is not None  # the mixed path runs
    q = torch.randn(batch.num_tokens, case.num_heads, case.head_dim)
    k, v = (torch.randn(batch.num_tokens, case.num_kv_heads, case.head_dim) for _ in range(2))
    out = attn.forward(q, k, v, 0, batch)
    for i, (p, e) in enumerate(zip(batch.prefix_lens, batch.extend_lens, strict=True)):
        q0, q1 = int(batch.qo_indptr[i]), int(batch.qo_indptr[i + 1])
        slots = batch.kv_indices[int(batch.kv_indptr[i]) : int(batch.kv_indptr[i + 1])]
        alone = ForwardBatch.build(torch.zeros(e, dtype=torch.int64), [e], [p], [slots])
        attn.plan(alone)
        ref = attn.forward(q[q0:q1], k[q0:q1], v[q0:q1], 0, alone)
        assert torch.allclose(out[q0:q1], ref, atol=1e-6, rtol=1e-5), (case.name, i)


# --- Triton kernels on the CPU (interpreter) ----------------------------------


# `triton_cpu_results`: tests/runtime/conftest.py (one interpreter subprocess per session).


@pytest.mark.parametrize("case", CPU_CASES, ids=[c.name for c in CPU_CASES])
def test_triton_interpreted_matches_torch(triton_cpu_results: dict, case: Case) -> None:
    """Extend cases also with the tile table of graph-captured steps (`<name>_tiled`)."""
    tol = FP32_TOL if case.dtype == torch.float32 else FP16_TOL
    seed = triton_cpu_results["seed"]
    names = [case.name] if case.is_decode else [case.name, case.name + "_tiled"]
    for name in names:
        got = triton_cpu_results["results"][name]
        assert got["out"] < tol, f"{name}: rel err {got['out']:.3g} (seed {seed})"
        assert got["pool"] == 0.0, f"{name}: K/V not written at out_slots (seed {seed})"


@pytest.mark.parametrize("name", list(CASCADE_CASES))
def test_triton_cascade_interpreted_matches_torch(triton_cpu_results: dict, name: str) -> None:
    """Shared-prefix decode (level 0 read once per group); the long prefix in several splits."""
    got = triton_cpu_results["cascade"][name]
    assert (got["prefix_splits"] > 1) == (name == "long_prefix"), got
    assert got["out"] < FP32_TOL, (name, got, triton_cpu_results["seed"])
    assert got["pool"] == 0.0, (name, got)


@pytest.mark.parametrize("name", list(CASCADE_CASES))
def test_triton_cascade_graph_state_matches_torch(triton_cpu_results: dict, name: str) -> None:
    """A cascade graph state's kernels over padded rows and garbage partials (a replayed
    graph's memory), and again on the same state with a group fewer: no stale slot counts."""
    got = triton_cpu_results["cascade_graph"][name]
    assert got["out"] < FP32_TOL, (name, got, triton_cpu_results["seed"])
    if len(CASCADE_CASES[name][0]) > 1:
        assert got["out_regrouped"] < FP32_TOL, (name, got, triton_cpu_results["seed"])


def test_interpreter_flag_did_not_leak(triton_cpu_results: dict) -> None:
    assert os.environ.get("TRITON_INTERPRET") != "1"


# --- GPU (device machine) ---------------------------------------------------

# Llama-3-8B and Qwen2.5-0.5B head layouts; the FlashInfer configurations
# match benchmarks/gpu_attention_check.py so its compiled kernels are reused.
GPU_CASES = [
    Case("llama8b_mixed", 32, 8, 128, (0, 300, 1000, 57, 0), (200, 77, 1, 1, 1), torch.bfloat16),
    Case("llama8b_decode", 32, 8, 128, (1023, 5, 700, 0, 64), (1, 1, 1, 1, 1), torch.bfloat16),
    Case("qwen05b_mixed", 14, 2, 64, (129, 0, 900), (64, 333, 1), torch.bfloat16),
    Case("qwen05b_decode", 14, 2, 64, (2000, 17, 3), (1, 1, 1), torch.bfloat16),
]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend_name", ["triton", "flashinfer", "flashinfer/flashinfer-decode"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.name for c in GPU_CASES])
def test_gpu_backend_matches_torch(backend_name: str, case: Case) -> None:
    """`flashinfer` decodes with the Triton kernel (its default); `/flashinfer-decode` with FlashInfer's."""
    name, _, decode = backend_name.partition("/")
    pytest.importorskip(name)
    pool, batch = make_pool_and_batch(case, "cuda", num_slots=8192)
    ref_pool = clone_pool(pool)
    backend = make_attention_backend(
        name,
        pool,
        case.num_heads,
        case.num_kv_heads,
        case.head_dim,
        case.head_dim**-0.5,
        decode_kernel="flashinfer" if decode else "auto",
    )
    got = compare(case, backend, ref_pool, batch)
    assert got["out"] < BF16_TOL, got
    assert got["pool"] == 0.0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
def test_gpu_cascade_matches_plain_attention(backend_name: str) -> None:
    """Shared-prefix decode on model head layouts: a long prefix shared by two groups (several
    prefix splits), rows outside any group, bf16 pool, against the float32 torch reference."""
    pytest.importorskip(backend_name)
    for hq, hkv, d in ((32, 8, 128), (14, 2, 64)):
        groups = [(list(range(0, 40)), 4096), ([41, 43, 44], 700)]
        suffix = [1 + (7 * i) % 90 for i in range(46)]
        fb, slots = shared_batch(groups, suffix, device="cuda")
        case = Case(f"cascade{hq}", hq, hkv, d, tuple(fb.prefix_lens), tuple(fb.extend_lens), torch.bfloat16)
        pool = KVPool(KVPoolConfig(case.num_layers, hkv, d, dtype=torch.bfloat16, device="cuda"), slots)
        for layer in range(case.num_layers):
            pool.k[layer].normal_()
            pool.v[layer].normal_()
        backend = make_attention_backend(backend_name, pool, hq, hkv, d, d**-0.5)
        got = compare(case, backend, clone_pool(pool), fb)
        assert got["out"] < BF16_TOL and got["pool"] == 0.0, (hq, got)


@pytest.mark.gpu
@needs_cuda
def test_triton_gpu_float32_decode_and_extend() -> None:
    pytest.importorskip("triton")
    for case in (
        Case("f32_mixed", 8, 2, 128, (100, 0), (37, 70)),
        Case("f32_decode", 8, 2, 128, (3000, 2), (1, 1)),
    ):
        pool, batch = make_pool_and_batch(case, "cuda")
        ref_pool = clone_pool(pool)
        backend = make_attention_backend("triton", pool, 8, 2, 128, 128**-0.5)
        got = compare(case, backend, ref_pool, batch)
        assert got["out"] < FP32_TOL, (case.name, got)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("decode_kernel", ["triton", "flashinfer"])
def test_flashinfer_cuda_graph_decode_replays_new_batches(decode_kernel: str) -> None:
    """Capture decode once, then replay it for batches with other contexts:
    plan outside the graph, run inside, outputs match the reference."""
    pytest.importorskip("flashinfer")
    from radixserve.runtime.attention.flashinfer_backend import flashinfer_attention

    heads, kv_heads, dim, bs, layers = 32, 8, 128, 4, 2
    cfg = KVPoolConfig(layers, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    pool = KVPool(cfg, 8192)
    for layer in range(layers):
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    backend = flashinfer_attention(pool, heads, kv_heads, dim, dim**-0.5, decode_kernel=decode_kernel)
    planner = backend.decode_graphs()
    assert planner is not None and planner.device_planned == (decode_kernel == "triton")
    state = planner.make_cuda_graph_decode_state(bs, max_kv_tokens=bs * 2048)
    static_q = torch.randn(bs, heads, dim, device="cuda", dtype=torch.bfloat16)
    static_kv = torch.randn(2, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    static_slots = torch.zeros(bs, dtype=torch.int64, device="cuda")

    def make_batch(prefixes: tuple[int, ...]) -> object:
        case = Case("g", heads, kv_heads, dim, prefixes, (1,) * bs, torch.bfloat16)
        _, batch = make_pool_and_batch(case, "cuda", num_slots=8192)
        return batch

    warm = make_batch((10, 20, 30, 40))
    static_slots.copy_(warm.out_slots)
    warm.out_slots = static_slots
    planner.plan_cuda_graph(state, warm)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up run off the default stream, as capture requires
        backend.forward(static_q, static_kv[0], static_kv[1], 0, warm)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.stack(
            [backend.forward(static_q, static_kv[0], static_kv[1], layer, warm) for layer in range(layers)]
        )

    for prefixes in ((1500, 3, 0, 777), (0, 0, 2000, 64)):
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
        ref = TorchAttention(ref_pool, heads, kv_heads, dim, dim**-0.5)
        ref.plan(batch)
        for layer in range(layers):
            # The graph already wrote this step's K/V; the reference writes the same values again.
            expect = ref.forward(static_q.float(), static_kv[0].float(), static_kv[1].float(), layer, batch)
            err = float((static_out[layer].double() - expect.double()).norm() / expect.double().norm())
            assert err < BF16_TOL, (prefixes, layer, err)


def test_decode_graph_states_share_one_page_table_sized_by_the_first() -> None:
    from radixserve.runtime.attention.graph_checks import SharedPageTable

    table = SharedPageTable(torch.device("cpu"))
    big = table.take(8, 100)
    small = table.take(4, 40)
    assert big.numel() == 100 and small.numel() == 40
    assert small.data_ptr() == big.data_ptr()  # a prefix of the first
    larger = table.take(8, 200)  # made after the first, larger: a buffer of its own
    assert larger.numel() == 200 and larger.data_ptr() != big.data_ptr()
    with pytest.raises(ValueError, match="max_kv_tokens >= batch_size"):
        table.take(8, 7)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        table.take(0, 7)
