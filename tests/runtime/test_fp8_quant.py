"""The FP8 linear's one-launch per-token quantizer (radixserve/runtime/fp8_quant.py) writes the
bytes and scales of `fp8_linear.quantize_rows`, over fp8_quant_cases.py.

On the CPU the Triton kernel runs under the interpreter (the session's subprocess,
tests/runtime/conftest.py); on the GPU (`-m gpu`) compiled, over the same cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from fp8_quant_cases import CASES, QuantCase, run_case  # noqa: E402


def _check(case: QuantCase, diffs: dict[str, float], seed: int) -> None:
    assert diffs["shape_ok"] == 1.0, f"{case.name}: shapes differ"
    assert diffs["bytes_off"] == 0.0, f"{case.name}: {diffs['bytes_off']:.0f} FP8 bytes differ (seed {seed})"
    assert diffs["scales_off"] == 0.0, f"{case.name}: scales off by {diffs['scales_off']} (seed {seed})"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_token_quant_equals_quantize_rows(triton_cpu_results: dict, case: QuantCase) -> None:
    _check(case, triton_cpu_results["fp8_quant"][case.name], triton_cpu_results["seed"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_compiled_token_quant_equals_quantize_rows(case: QuantCase) -> None:
    _check(case, run_case(case, "cuda", seed=0), 0)
