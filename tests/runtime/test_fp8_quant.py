"""The FP8 linear's one-launch per-token quantizer (radixserve/runtime/fp8_quant.py) writes the
bytes and scales of `fp8_linear.quantize_rows`, over fp8_quant_cases.py; its SiLU·mul-fused
form those of `quantize_rows(silu(gate) * up)` up to the exponential's last bit; the residual
add + RMSNorm fused with it the reference kernels' residual exactly and the quantized norm up to
the reciprocal square root's last bit.

On the CPU the Triton kernel runs under the interpreter (the session's subprocess,
tests/runtime/conftest.py); on the GPU (`-m gpu`) compiled, over the same cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from fp8_quant_cases import (  # noqa: E402
    CASES,
    NORM_BYTES_OFF,
    NORM_CASES,
    NORM_SCALE_RTOL,
    SILU_BYTES_OFF,
    SILU_CASES,
    SILU_SCALE_RTOL,
    NormCase,
    QuantCase,
    run_case,
    run_norm_case,
    run_silu_case,
)


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


def _check_near(name: str, diffs: dict[str, float], seed: int, bytes_off: float, scale_rtol: float) -> None:
    """Bytes and scales within the kernel's stated gap from the reference's."""
    assert diffs["shape_ok"] == 1.0, f"{name}: shapes differ"
    share = diffs["bytes_off_share"]
    assert share <= bytes_off, f"{name}: {share:.2%} of the FP8 bytes differ (seed {seed})"
    assert diffs["scales_rel_off"] <= scale_rtol, f"{name}: scales off (seed {seed})"


def _check_silu(case: QuantCase, diffs: dict[str, float], seed: int) -> None:
    _check_near(case.name, diffs, seed, SILU_BYTES_OFF, SILU_SCALE_RTOL)


@pytest.mark.parametrize("case", SILU_CASES, ids=[c.name for c in SILU_CASES])
def test_silu_mul_quant_equals_quantize_rows(triton_cpu_results: dict, case: QuantCase) -> None:
    _check_silu(case, triton_cpu_results["fp8_silu_quant"][case.name], triton_cpu_results["seed"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", SILU_CASES, ids=[c.name for c in SILU_CASES])
def test_compiled_silu_mul_quant_equals_quantize_rows(case: QuantCase) -> None:
    _check_silu(case, run_silu_case(case, "cuda", seed=0), 0)


def _check_norm(case: NormCase, diffs: dict[str, float], seed: int) -> None:
    assert diffs["residual_off"] == 0.0, f"{case.name}: the residual stream differs (seed {seed})"
    _check_near(case.name, diffs, seed, NORM_BYTES_OFF, NORM_SCALE_RTOL)


@pytest.mark.parametrize("case", NORM_CASES, ids=[c.name for c in NORM_CASES])
def test_add_norm_quant_equals_reference_norm_then_quantize_rows(
    triton_cpu_results: dict, case: NormCase
) -> None:
    _check_norm(case, triton_cpu_results["fp8_norm_quant"][case.name], triton_cpu_results["seed"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", NORM_CASES, ids=[c.name for c in NORM_CASES])
def test_compiled_add_norm_quant_equals_reference_norm_then_quantize_rows(case: NormCase) -> None:
    _check_norm(case, run_norm_case(case, "cuda", seed=0), 0)


def test_start_up_builds_every_fp8_kernel_at_the_model_widths(triton_cpu_results: dict) -> None:
    """An FP8 engine's start compiles each quantizer at each width its steps quantize
    (fp8_builds.kernel_builds over model/fp8.fp8_use): a llama of hidden 64, 4 heads of 16 (o_proj's
    input 64) and MLP 96, whose down projection takes the SiLU·mul form only; interpreted here."""
    assert triton_cpu_results["fp8_builds"] == [
        "triton fp8 input quantizer bf16 width 64",
        "triton fp8 SiLU·mul input quantizer bf16 width 96",
        "triton fp8 add + RMSNorm quantizer bf16 width 64",
    ]
