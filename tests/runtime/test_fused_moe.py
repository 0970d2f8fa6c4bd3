"""The fused MoE kernels (radixserve/runtime/fused_moe.py) equal the model's reference loop.

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
from moe_cases import CASES, run_moe_cases  # noqa: E402


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_fused_moe_equals_the_reference_loop(triton_cpu_results: dict, name: str) -> None:
    got = triton_cpu_results["moe"][name]
    assert got["aligned"], f"{name}: a pair missing, twice, or in another expert's block"
    assert got["rel_err"] < 1e-5, f"{name}: {got} (seed {triton_cpu_results['seed']})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_fused_moe_equals_the_reference_loop_in_bf16() -> None:
    got = run_moe_cases(seed=0, device="cuda")
    assert all(g["aligned"] for g in got.values()), got
    assert all(g["rel_err"] < 2e-2 for g in got.values()), got  # bf16 rounding of 2 GEMMs
