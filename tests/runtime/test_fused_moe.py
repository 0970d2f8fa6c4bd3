"""The fused MoE kernels (runtime/fused_moe.py, moe_align.py) equal the model's reference loop,
and the one-kernel router (runtime/moe_route.py) equals transformers' softmax-topk-renormalise.

On the CPU the Triton kernels run under the interpreter (the session's subprocess,
tests/runtime/conftest.py) in float32 over moe_cases.py: one token, decode-sized and
prefill-sized batches, experts with no tokens and long runs, sizes that are not multiples
of the blocks. On the GPU (`-m gpu`) compiled, in bfloat16.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from moe_cases import CASES, ROUTE_CASES, run_moe_cases, run_route_cases  # noqa: E402

from radixserve.runtime.moe_align import PARALLEL_PAIRS  # noqa: E402


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_fused_moe_equals_the_reference_loop(triton_cpu_results: dict, name: str) -> None:
    got = triton_cpu_results["moe"][name]
    assert got["aligned"], f"{name}: a pair missing, twice, or in another expert's block"
    assert got["rel_err"] < 1e-5, f"{name}: {got} (seed {triton_cpu_results['seed']})"


def test_cases_take_both_alignment_paths() -> None:
    """Decode-sized cases align in one program, prefill-sized ones in a program per chunk."""
    pairs = [c.tokens * c.top_k for c in CASES]
    assert min(pairs) <= PARALLEL_PAIRS < max(pairs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_fused_moe_equals_the_reference_loop_in_bf16() -> None:
    got = run_moe_cases(seed=0, device="cuda")
    assert all(g["aligned"] for g in got.values()), got
    assert all(g["rel_err"] < 2e-2 for g in got.values()), got  # bf16 rounding of 2 GEMMs


@pytest.mark.parametrize("name", [c[0] for c in ROUTE_CASES])
def test_router_kernel_equals_the_reference_router(triton_cpu_results: dict, name: str) -> None:
    got = triton_cpu_results["moe_route"][name]
    assert got["same_experts"], f"{name}: other experts picked (seed {triton_cpu_results['seed']})"
    assert got["max_err"] < 1e-6, f"{name}: {got} (seed {triton_cpu_results['seed']})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_router_kernel_equals_the_reference_router_in_bf16() -> None:
    got = run_route_cases(seed=0, device="cuda")
    # bf16 logits: equal probabilities tie more often, so compare the weights where ids agree
    assert sum(g["same_experts"] for g in got.values()) >= len(got) - 1, got
    assert all(g["max_err"] < 1e-2 for g in got.values() if g["same_experts"]), got
