"""Cases for the FP8 linear's per-token quantizer (radixserve/runtime/fp8_quant.py): its bytes
and scales against `fp8_linear.quantize_rows`, the torch specification.

Each case builds a `[M, K]` activation; `run_case` quantizes it both ways and counts the FP8
bytes that differ and the largest scale difference (both must be zero). Rows cover what
decode and prefill hand the linear: a few tokens with K below one block, many tokens with K
past `MAX_BLOCK` (two passes with a tail), rows of a wider buffer (strided), float16 and
float32 inputs, an all-zero row, and a row whose scale is exactly 1 holding the e4m3 grid's
ties (they round to the even neighbour), subnormals and the saturation bound.

The fused `silu_mul_quantize_tokens` is checked against `quantize_rows` of `silu(gate) * up`
computed in float32 and rounded to the input's dtype (what the unfused activation kernel
stores). The exponential is the interpreter's (numpy) or the GPU's against torch's, which may
differ in the last float32 bit and so flip a rounding of the activation to bfloat16 (about one
element in 2^16): a few bytes may differ, each by one e4m3 step. Skipping the rounding to the
input's dtype alone moves 1.5-2.2% of the bfloat16 cases' bytes (0.13% of the float16 one's), so
`SILU_BYTES_OFF` stays below that.

Imported by interpreted_cases.py (the CPU, under Triton's interpreter) and by
test_fp8_quant.py (compiled on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.runtime.fp8_linear import quantize_rows


@dataclass(frozen=True)
class QuantCase:
    name: str
    m: int
    k: int
    dtype: torch.dtype
    row_pad: int = 0  # the rows live in a buffer this much wider than K
    special_rows: bool = False  # an all-zero row and the row of ties


CASES = [
    QuantCase("decode_bf16", m=7, k=96, dtype=torch.bfloat16),
    QuantCase("prefill_two_blocks_bf16", m=33, k=2128, dtype=torch.bfloat16),
    QuantCase("strided_rows_fp16", m=5, k=160, dtype=torch.float16, row_pad=32),
    QuantCase("ties_zero_row_fp32", m=4, k=64, dtype=torch.float32, special_rows=True),
    QuantCase("empty", m=0, k=64, dtype=torch.bfloat16),
]

# With the row's absmax 448 the scale is exactly 1, so these reach the rounding unchanged:
# midpoints between e4m3 neighbours (1.0625 between 1 and 1.125; 17 between 16 and 18;
# 0.0029296875 = 1.5 * 2^-9, between the subnormals 2^-9 and 2^-8) and values off them.
TIES = [448.0, 1.0625, 1.1875, 17.0, 19.0, -1.0625, -17.0, 0.0029296875, 0.0048828125, 3.3, -0.0007, 1e-9]


def make_input(case: QuantCase, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(case.m, case.k + case.row_pad, generator=gen) * 3
    base[:, : case.k : 7] *= 40  # outliers: each row's scale comes from a few large values
    if case.special_rows and case.m >= 2:
        base[0] = 0.0
        base[1, : len(TIES)] = torch.tensor(TIES)
        base[1, len(TIES) : case.k] = 0.5
    return base.to(case.dtype).to(device)[:, : case.k]


def run_case(case: QuantCase, device: str, seed: int) -> dict[str, float]:
    from radixserve.runtime.fp8_quant import quantize_tokens  # imports triton

    x = make_input(case, device, seed)
    return compare(quantize_tokens(x), quantize_rows(x.cpu()))


def compare(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    """How far quantized rows and scales (`got`, any device) lie from the reference's (`want`)."""
    got_values, got_scales = got[0].cpu(), got[1].cpu()
    want_values, want_scales = want
    off = float((got_values.view(torch.uint8) != want_values.view(torch.uint8)).sum())
    rows = want_scales.numel()
    return {
        "shape_ok": float(got_values.shape == want_values.shape and got_scales.shape == want_scales.shape),
        "bytes_off": off,
        "bytes_off_share": off / max(want_values.numel(), 1),
        "scales_off": float((got_scales - want_scales).abs().max()) if rows else 0.0,
        "scales_rel_off": float(((got_scales - want_scales).abs() / want_scales).max()) if rows else 0.0,
    }


def run_fp8_quant_cases(seed: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    return {case.name: run_case(case, device, seed) for case in CASES}


# A gated MLP's gate/up output `[M, 2 * I]`: decode rows in one block; prefill rows past
# MAX_BLOCK with a tail (I = 2,128: two passes); strided fp16 rows; none.
SILU_CASES = [
    QuantCase("silu_decode_bf16", m=16, k=256, dtype=torch.bfloat16),
    QuantCase("silu_prefill_two_blocks_bf16", m=17, k=2128, dtype=torch.bfloat16),
    QuantCase("silu_strided_rows_fp16", m=5, k=160, dtype=torch.float16, row_pad=32),
    QuantCase("silu_empty", m=0, k=64, dtype=torch.bfloat16),
]
# Largest share of FP8 bytes that may differ (see the module doc), and the scales' relative gap:
# one ulp of bfloat16 in the row's absmax.
SILU_BYTES_OFF = 1e-3
SILU_SCALE_RTOL = 2.0**-7


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in float32, rounded to the input's dtype."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


def run_silu_case(case: QuantCase, device: str, seed: int) -> dict[str, float]:
    from radixserve.runtime.fp8_quant import silu_mul_quantize_tokens  # imports triton

    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(case.m, 2 * case.k + case.row_pad, generator=gen) * 2
    base[:, : 2 * case.k : 5] *= 8  # large gates and ups: each row's scale comes from a few values
    gate_up = base.to(case.dtype).to(device)[:, : 2 * case.k]
    return compare(silu_mul_quantize_tokens(gate_up), quantize_rows(silu_mul_reference(gate_up.cpu())))


def run_silu_quant_cases(seed: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    return {case.name: run_silu_case(case, device, seed) for case in SILU_CASES}


# The residual add + RMSNorm before an FP8 linear, fused with its quantizer: decode rows, prefill
# rows of llama-3.1-8b's hidden size, a width that is not a power of two (a masked tail), Gemma's
# (1 + w) norm, strided input rows, float16, none. `x` is the sublayer's output, `residual` the
# stream, `weight` the norm's (around its unit value, as checkpoints hold it).
@dataclass(frozen=True)
class NormCase:
    name: str
    m: int
    k: int
    dtype: torch.dtype
    plus_one: bool = False
    row_pad: int = 0  # x's rows live in a buffer this much wider than K


NORM_CASES = [
    NormCase("norm_decode_bf16", m=9, k=256, dtype=torch.bfloat16),
    NormCase("norm_prefill_llama_width_bf16", m=40, k=4096, dtype=torch.bfloat16),
    NormCase("norm_masked_tail_strided_bf16", m=6, k=896, dtype=torch.bfloat16, row_pad=64),
    NormCase("norm_gemma_bf16", m=8, k=640, dtype=torch.bfloat16, plus_one=True),
    NormCase("norm_fp16", m=5, k=320, dtype=torch.float16),
    NormCase("norm_empty", m=0, k=256, dtype=torch.bfloat16),
]
# The kernel's reciprocal square root and sum of squares are the interpreter's (numpy) or the
# GPU's against torch's: a last-bit difference in the row's scale flips a rounding of the normed
# row to the stream's dtype now and then, and can move the row's absmax by one ulp of it.
NORM_BYTES_OFF = 2e-3
NORM_SCALE_RTOL = 2.0**-7


def norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, plus_one: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x) by the reference kernels (transformers' arithmetic)."""
    from radixserve.runtime.kernels import TorchKernels

    if plus_one:
        return TorchKernels().gemma_add_rms_norm(x, residual, weight, eps)
    return TorchKernels().add_rms_norm(x, residual, weight, eps)


def run_norm_case(case: NormCase, device: str, seed: int) -> dict[str, float]:
    from radixserve.runtime.fp8_quant import add_rms_norm_quantize_tokens  # imports triton

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(case.m, case.k + case.row_pad, generator=gen) * 4).to(case.dtype)[:, : case.k]
    residual = (torch.randn(case.m, case.k, generator=gen) * 2).to(case.dtype)
    unit = 0.0 if case.plus_one else 1.0
    weight = (unit + 0.3 * torch.randn(case.k, generator=gen)).to(case.dtype)
    eps = 1e-5
    want_normed, want_residual = norm_reference(x, residual.clone(), weight, eps, case.plus_one)
    got_residual = residual.to(device)
    got = add_rms_norm_quantize_tokens(x.to(device), got_residual, weight.to(device), eps, case.plus_one)
    residual_off = (got_residual.cpu().float() - want_residual.float()).abs().max() if case.m else 0.0
    return {**compare(got, quantize_rows(want_normed)), "residual_off": float(residual_off)}


def run_norm_quant_cases(seed: int, device: str = "cpu") -> dict[str, dict[str, float]]:
    return {case.name: run_norm_case(case, device, seed) for case in NORM_CASES}


def run_build_cases() -> list[str]:
    """The start-up builds of an FP8 llama-like model's kernels (fp8_builds.kernel_builds at the
    model's widths, from model/fp8.fp8_use), run as an FP8 engine's start runs them; the labels
    they logged (a failed build raises KernelBuildError)."""
    from radixserve.model.fp8 import fp8_use, quantize_model_
    from radixserve.runtime.fp8_builds import kernel_builds
    from radixserve.runtime.warm_up import run_builds

    model = tiny_llama()
    quantize_model_(model)
    builds = kernel_builds(fp8_use(model, torch.bfloat16, torch.device("cpu"), plus_one=False))
    run_builds(builds, torch.device("cpu"))
    return [b.label for b in builds]


def tiny_llama() -> torch.nn.Module:
    """A bf16 llama of hidden 64, 4 heads of 16, MLP 96, two layers, random weights."""
    from transformers import LlamaConfig

    from radixserve.model.config import ModelConfig
    from radixserve.model.decoder import DecoderForCausalLM

    hf = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = DecoderForCausalLM(ModelConfig.from_hf(hf), torch.bfloat16)
    for p in model.parameters():
        p.data.normal_(0.0, 0.02)
    return model
